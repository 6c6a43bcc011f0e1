"""Whole SSE events, and the token ids a stream has delivered to its client.

Two jobs on the per-chunk path, done with a few C-level `bytes` searches per event and no JSON
parsing (parsing every event would cost more than the rest of the relay):

- `EventAligner`: only whole events (ending in a blank line) go on; a partial tail waits for
  the rest. A stream cut mid-way then never leaves its client with half an event.
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

import orjson

_EVENT_END = b"\n\n"
_DONE = b"data: [DONE]\n\n"
# Matches both `"token_ids":` and `"prompt_token_ids":`; which one is told by the bytes before.
_IDS_KEY = b'token_ids":'
_IDS_KEY_LEN = len(_IDS_KEY)
_PROMPT_PREFIX = b',"prompt_'  # the bytes before `token_ids":` of `,"prompt_token_ids":`
_PROMPT_TEXT_NULL = b',"prompt_text":null'
_NULL = b"null"
_ERROR_EVENT = b'data: {"error"'
_NO_CHOICES = b'"choices":[]'


class EventAligner:
    """Passes whole SSE events only, holding a partial tail back until its end arrives."""

    __slots__ = ("tail",)

    def __init__(self) -> None:
        self.tail = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.tail + chunk if self.tail else chunk
        end = data.rfind(_EVENT_END)
        if end < 0:
            self.tail = data
            return b""
        end += 2
        if end == len(data):
            self.tail = b""
            return data
        self.tail = data[end:]
        return data[:end]


class TokenLedger(EventAligner):
    """The token ids a generation stream delivered, across every backend leg it had.

    Per leg, call `start_leg(...)`; then `feed(chunk)` returns the whole events to pass on
    (with the id fields removed when `strip`).
    """

    __slots__ = (
        "_chat",
        "_generated",
        "_slices",
        "done",
        "error_event",
        "events",
        "finished",
        "first_event",
        "not_movable",
        "prompt_slice",
        "safe",
        "strip",
        "usage_seen",
    )

    def __init__(self) -> None:
        super().__init__()
        self.strip = True
        self._chat = False
        self.prompt_slice = b""  # the raw `[...]` of prompt_token_ids, from the first leg
        self._slices: list[bytes] = []  # each event's raw `[...]` of token_ids, in order
        self._generated: list[int] | None = None  # parsed _slices, cached
        self.safe = 0  # slices after which the client's text is complete
        self.first_event = b""  # the stream's first event: its id, created and model
        self.events = 0  # whole events passed on, over all legs
        self.finished = False  # an event carried a finish_reason
        self.done = False  # `data: [DONE]` passed
        self.usage_seen = False  # the final usage event (no choices) passed
        self.error_event = False  # the backend sent an `{"error": ...}` event
        self.not_movable = ""  # the stream showed a shape a continuation cannot splice

    def start_leg(self, *, strip: bool, chat: bool) -> None:
        """A new backend leg: `chat` when its events are chat chunks, `strip` to remove the
        id fields from them. Whatever partial event the last leg left is dropped."""
        self.tail = b""
        self.strip = strip
        self._chat = chat
        self.done = False
        self.error_event = False

    def feed(self, chunk: bytes) -> bytes:
        data = EventAligner.feed(self, chunk)
        if not data:
            return data
        self.events += data.count(_EVENT_END)
        if not self.first_event:
            self.first_event = data[: data.find(_EVENT_END)]
        if data.endswith(_DONE):
            self.done = True
        if _ERROR_EVENT in data:
            self.error_event = True
        if _NO_CHOICES in data:
            self.usage_seen = True  # only the final usage event has no choices
        pos = data.find(_IDS_KEY)
        if pos < 0:
            return data
        strip = self.strip
        pieces: list[bytes] = []
        start = 0
        while pos >= 0:
            value = pos + _IDS_KEY_LEN
            # A null, or a list of ints: its first "]" closes it.
            close = value + 4 if data.startswith(_NULL, value) else data.index(b"]", value) + 1
            if data.startswith(_PROMPT_PREFIX, pos - 9):
                field = pos - 9
                if not self.prompt_slice and close - value > 4:
                    self.prompt_slice = data[value:close]
                if data.startswith(_PROMPT_TEXT_NULL, close):
                    close += len(_PROMPT_TEXT_NULL)  # chat's companion field, null with it
            else:
                field = pos - 2  # the comma and the opening quote
                self._token_event(data, value, close)
            if strip:
                pieces.append(data[start:field])
                start = close
            pos = data.find(_IDS_KEY, close)
        if not strip:
            return data
        pieces.append(data[start:])
        return b"".join(pieces)

    def _token_event(self, data: bytes, value: int, close: int) -> None:
        self._slices.append(data[value:close])
        self._generated = None
        begin = data.rfind(_EVENT_END, 0, value) + 1
        if data.find(b'"finish_reason":null', begin, value) < 0:
            self.finished = True
        if self._chat:
            at = data.find(b'"delta":{"content":"', begin, value)
            if at < 0:
                # A reasoning or tool-call delta, or a final empty one; only the last is fine.
                if not self.finished and not self.not_movable:
                    self.not_movable = "structured_delta"
                return
            empty = data[at + 20] == 0x22  # the string closes at once: ""
        else:
            empty = data.find(b'"text":"",', begin, value) >= 0
        if not empty:
            self.safe = len(self._slices)

    # --- read when a request moves (or for the admin API), never per chunk

    @property
    def generated(self) -> list[int]:
        """Every generated token id the stream delivered, in order."""
        ids = self._generated
        if ids is None:
            ids = []
            for raw in self._slices:
                ids.extend(orjson.loads(raw))
            self._generated = ids
        return ids

    def safe_generated(self) -> list[int]:
        """The generated ids up to the last event whose text the client received whole: the
        point a continuation starts from."""
        ids: list[int] = []
        for raw in self._slices[: self.safe]:
            ids.extend(orjson.loads(raw))
        return ids

    def prompt_ids(self) -> list[int] | None:
        if not self.prompt_slice:
            return None
        ids = orjson.loads(self.prompt_slice)
        return ids if isinstance(ids, list) else None

    def rewind_to_safe(self) -> None:
        """Forget the tokens after the cut: the target generates them again."""
        if self.safe < len(self._slices):
            del self._slices[self.safe :]
            self._generated = None

    @property
    def token_events(self) -> int:
        return len(self._slices)
