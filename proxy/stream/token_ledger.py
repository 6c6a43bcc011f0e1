"""Whole SSE events, and the token ids a stream has delivered to its client.

Two jobs on the per-chunk path, done with a few C-level `bytes` searches per event and no JSON
parsing (parsing every event would cost more than the rest of the relay):

- `EventAligner`: only whole events (ending in a blank line) go on; a partial tail waits for
  the rest. A stream cut mid-way then never leaves its client with half an event. SSE lets a
  line end in CRLF, LF or CR: a stream framed with CR is re-framed to LF (what every reader
  here, and the proxy's own events, use), and an event still unfinished after
  `max_event_bytes` fails the leg (`EventTooLarge`) instead of growing without limit.
- `TokenLedger`: for a request that may move, vLLM is asked for `return_token_ids`; each event
  then carries `"token_ids":[...]` (and the first one the prompt's `"prompt_token_ids":[...]`).
  The ledger keeps those lists as the raw bytes they came in (parsed only if the request
  moves, or the admin API asks), and removes the fields from what the client sees unless the
  client asked for them itself.

Where a move may cut: after the last event whose text was not empty. vLLM sends a token's
text only once it is complete UTF-8 (a character split over two tokens arrives with the
second), so a token whose event carried empty text may hold half a character the client has
not seen; the target regenerates such tokens rather than the client losing that text.

vLLM writes these events with its own serializer: compact JSON, `token_ids` never the first
key of a choice (so always preceded by a comma), and a quote inside generated text always
escaped (so `token_ids":` cannot appear inside a string value).
"""

from __future__ import annotations

import re
from collections import deque

import orjson

from proxy.stream.sse import DONE_EVENT, ERROR_EVENT_START

_EVENT_END = b"\n\n"
_CR = ord("\r")  # `int in bytes` is one memchr; `b"\r" in bytes` costs ten times more
_NO_CHOICES = b'"choices":[]'
_FINISHED = b'"finish_reason":"'  # a finish_reason that is a string, not null
_TOKEN_IDS_KEY = b'"token_ids":'
_TOKEN_EVENT_END = b"]}]}\n\n"  # a token event's last bytes: its token_ids closes the choice
# Chunks kept for the look back at a cut: more than the longest run of tokens with empty text
# (a character split over at most four byte tokens).
RECENT_CHUNKS = 8
_TEXT_EMPTY = b'"text":"",'
_CHAT_EMPTY = b'"delta":{"content":""'
_CHAT_CONTENT = b'"delta":{"content":'
# Every id field vLLM adds for return_token_ids, with the comma before it; group 1 is the value
# of a `token_ids` field (None for the prompt's fields). vLLM writes compact JSON.
_ID_FIELDS = re.compile(
    rb',"(?:prompt_token_ids":(?:null|\[[\d,]*\])(?:,"prompt_text":null)?|token_ids":(\[[\d,]*\]))'
)
_TOKEN_IDS = re.compile(rb'"token_ids":(\[[\d,]*\])')
_PROMPT_IDS = re.compile(rb'"prompt_token_ids":(\[[\d,]*\])')


# The default cap on one unfinished event (the `max_sse_event_bytes` setting): far above any
# event vLLM writes (a chunk with top-20 logprobs is a few KiB per token).
DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024


class EventTooLarge(Exception):
    """The backend sent more than `max_event_bytes` without ending its event."""


class EventAligner:
    """Passes whole SSE events only, holding a partial tail back until its end arrives.

    A chunk with no CR in it and no partial event pending (nearly every chunk of an LF stream)
    costs two C-level searches; everything else takes `_slow_feed`, which re-frames CRLF and CR
    line ends to LF and keeps a partial event as a list of pieces joined once, when it ends.
    """

    __slots__ = ("_held", "_parts", "_skip_lf", "max_event_bytes", "pending")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self.pending = False  # a partial event is held, or the last byte seen was a CR
        self._parts: list[bytes] = []  # the partial event's pieces
        self._held = 0  # their length
        self._skip_lf = False  # the last chunk ended in CR: an LF opening the next one is its pair

    @property
    def tail(self) -> bytes:
        """The bytes of the event not finished yet."""
        return b"".join(self._parts)

    def reset(self) -> None:
        """Forget any partial event (a new leg starts)."""
        self._parts = []
        self._held = 0
        self._skip_lf = self.pending = False

    def feed(self, chunk: bytes) -> bytes:
        if self.pending or _CR in chunk:
            return self._slow_feed(chunk)
        end = chunk.rfind(_EVENT_END)
        if end < 0:
            self._hold(chunk)
            return b""
        end += 2
        if end == len(chunk):
            return chunk
        self._hold(chunk[end:])
        return chunk[:end]

    def _slow_feed(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        if self._skip_lf and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        if _CR in chunk:
            self._skip_lf = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        else:
            self._skip_lf = False
        parts = self._parts
        if parts:
            # The blank line may straddle the pieces: one ends in LF, the next starts with LF.
            if _EVENT_END not in chunk and not (
                chunk.startswith(b"\n") and parts[-1].endswith(b"\n")
            ):
                self._hold(chunk)
                return b""
            parts.append(chunk)
            data = b"".join(parts)
            self._parts = []
            self._held = 0
        else:
            data = chunk
        end = data.rfind(_EVENT_END)
        if end < 0:
            self._hold(data)
            return b""
        end += 2
        if end < len(data):
            self._hold(data[end:])
            data = data[:end]
        self.pending = self._skip_lf or bool(self._parts)
        return data

    def _hold(self, piece: bytes) -> None:
        if not piece:
            self.pending = self._skip_lf or bool(self._parts)
            return
        self._held += len(piece)
        if self._held > self.max_event_bytes:
            held = self._held
            self.reset()
            raise EventTooLarge(
                f"the backend sent an SSE event over max_sse_event_bytes "
                f"({held} bytes without its end, the cap is {self.max_event_bytes})"
            )
        self._parts.append(piece)
        self.pending = True


class TokenLedger:
    """The token ids a generation stream delivered, across every backend leg it had.

    Per leg, call `start_leg(...)`; then `feed(chunk)` returns the whole events to pass on
    (with the id fields removed when `strip`). Per chunk it does one regex pass and keeps a
    reference to the chunk in a short window; everything else (where to cut, whether the
    stream had finished) is read from that window when the stream is cut.
    """

    __slots__ = (
        "_cached",
        "_chat",
        "_recent",
        "_slices",
        "done",
        "error_event",
        "events",
        "first_event",
        "prompt_slice",
        "sent",
        "strip",
    )

    def __init__(self) -> None:
        self.events = EventAligner()  # the partial event held; its cap is set per leg
        self.strip = True
        self._chat = False
        self.prompt_slice = b""  # the raw `[...]` of prompt_token_ids, from the first leg
        self._slices: list[bytes] = []  # each token event's raw `[...]` of token_ids, in order
        self._cached: tuple[int, list[int]] = (0, [])  # parsed _slices[:n]
        # The last whole-event chunks of this leg (references, no copies): the end of the
        # stream as the client got it, read only when the stream is cut.
        self._recent: deque[bytes] = deque(maxlen=RECENT_CHUNKS)
        self.first_event = b""  # the stream's first event: its id, created and model
        self.sent = False  # whole events were passed on
        self.done = False  # this leg's `data: [DONE]` passed
        self.error_event = False  # this leg's backend sent an `{"error": ...}` event

    def start_leg(self, *, strip: bool, chat: bool) -> None:
        """A new backend leg: `chat` when its events are chat chunks, `strip` to remove the
        id fields from them. Whatever partial event the last leg left is dropped."""
        self.events.reset()
        self.strip = strip
        self._chat = chat
        self.done = False
        self.error_event = False
        self._recent.clear()

    def feed(self, chunk: bytes) -> bytes:
        # EventAligner.feed's common case inlined (this runs for every chunk of every movable
        # stream): a chunk of whole LF-framed events with nothing held before it.
        events = self.events
        if events.pending or not chunk.endswith(_EVENT_END) or _CR in chunk:
            data = events.feed(chunk)
            if not data:
                return b""
        else:
            data = chunk
        self._recent.append(data)
        if not self.prompt_slice:
            self._opening(data)
        if not data.endswith(_TOKEN_EVENT_END):
            # The rare chunk that does not end with tokens: the opening, usage, end or error.
            if data.endswith(DONE_EVENT):
                self.done = True
            if ERROR_EVENT_START in data:
                self.error_event = True
        if self.strip:
            # One C-level pass: the text between the id fields, and each token_ids value
            # (None for the prompt's fields, which are only removed).
            parts = _ID_FIELDS.split(data)
            if len(parts) > 1:
                self._slices += [p for p in parts[1::2] if p is not None]
                data = b"".join(parts[::2])
        else:
            self._slices += _TOKEN_IDS.findall(data)
        return data

    def _opening(self, data: bytes) -> None:
        if not self.first_event:
            self.first_event = data[: data.find(_EVENT_END)]
            self.sent = True
        found = _PROMPT_IDS.search(data)
        if found is not None:
            self.prompt_slice = found.group(1)

    # --- read when the stream is cut (or for the admin API), never per chunk

    def _tail_events(self) -> list[bytes]:
        events: list[bytes] = []
        for data in self._recent:
            events += [e for e in data.split(_EVENT_END) if e]
        return events

    @property
    def finished(self) -> bool:
        """The last token event carried a finish_reason: every token reached the client."""
        for event in reversed(self._tail_events()):
            if _NO_CHOICES in event:
                return True  # the usage event comes after the last token
            if _TOKEN_IDS_KEY in event:
                return _FINISHED in event
        return False

    @property
    def usage_seen(self) -> bool:
        return any(_NO_CHOICES in e for e in self._tail_events())

    @property
    def not_movable(self) -> str:
        """Why the stream, as it looks now, cannot be continued elsewhere ("" if it can)."""
        if self._chat:
            for event in self._tail_events():
                if _TOKEN_IDS_KEY in event and _CHAT_CONTENT not in event:
                    if _FINISHED in event:
                        continue  # a final event with an empty delta
                    # A reasoning or tool-call delta: a continuation could not rebuild it.
                    return "structured_delta"
        return ""

    def safe(self) -> int:
        """Token events after which the client's text is complete: the last event with text.

        A token whose text was empty may hold part of a character (vLLM sends the character
        with a later token); such trailing tokens are generated again rather than lost."""
        n = len(self._slices)
        empty = _CHAT_EMPTY if self._chat else _TEXT_EMPTY
        trailing = 0
        for event in reversed(self._tail_events()):
            if _TOKEN_IDS_KEY not in event:
                continue
            if empty not in event:
                return n - trailing
            trailing += 1
        return n  # no event with text in the window: cut after everything sent

    @property
    def generated(self) -> list[int]:
        """Every generated token id the stream delivered, in order."""
        n, ids = self._cached
        if n != len(self._slices):
            ids = list(ids)
            for raw in self._slices[n:]:
                ids.extend(orjson.loads(raw))
            self._cached = (len(self._slices), ids)
        return ids

    def prompt_ids(self) -> list[int] | None:
        if not self.prompt_slice:
            return None
        ids = orjson.loads(self.prompt_slice)
        return ids if isinstance(ids, list) else None

    def rewind_to_safe(self) -> None:
        """Forget the tokens after the cut: the target generates them again."""
        safe = self.safe()
        if safe < len(self._slices):
            del self._slices[safe:]
            self._cached = (0, [])

    @property
    def token_events(self) -> int:
        return len(self._slices)
