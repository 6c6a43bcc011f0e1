"""Whether an Anthropic Messages stream reached its end.

A Messages stream ends with `event: message_stop` (or, when the engine gave up, its own
`event: error`). One that stops before, its connection closed cleanly, is cut: the client
must learn it from an error event, not from a silent close. `MessagesAligner` aligns the
stream's chunks on whole events as `EventAligner` does, and notes the name of the last event
it passed.
"""

from __future__ import annotations

from proxy.stream.token_ledger import EventAligner

# The events after which a Messages stream is over.
_ENDINGS = frozenset({b"message_stop", b"error"})


class MessagesAligner(EventAligner):
    __slots__ = ("complete",)

    def __init__(self, max_event_bytes: int) -> None:
        super().__init__(max_event_bytes)
        self.complete = False  # the last event passed ends the stream

    def feed(self, chunk: bytes) -> bytes:
        out = super().feed(chunk)
        if out:
            self.complete = last_event_name(out) in _ENDINGS
        return out


def last_event_name(events: bytes) -> bytes:
    """The `event:` name of the last event in whole events (b"" when it has none). JSON data
    escapes its newlines, so a line that starts with `event:` is a field, never data."""
    start = events.rfind(b"\nevent:") + 1
    if start == 0 and not events.startswith(b"event:"):
        return b""
    end = events.find(b"\n", start)
    return events[start + 6 : end if end >= 0 else len(events)].strip()
