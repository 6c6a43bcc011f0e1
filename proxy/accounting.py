"""The proxy's per-backend accounting for one dispatched request.

Charged at dispatch (in flight, pending prefill tokens), moved at the first token (pending ->
decoding) and released exactly once at the end, whatever way the request ends.
"""

from __future__ import annotations

from fleet.types import Load


class Dispatch:
    __slots__ = ("decoding", "load", "pending")

    def __init__(self, load: Load, prompt_tokens: int) -> None:
        self.load = load
        self.pending = prompt_tokens
        self.decoding = False
        load.in_flight += 1
        load.pending_prefill_tokens += prompt_tokens
        load.dispatched_total += 1

    def prefilled(self) -> None:
        """The prompt is processed: its tokens are no longer pending."""
        self.load.pending_prefill_tokens -= self.pending
        self.pending = 0

    def first_token(self) -> None:
        self.prefilled()
        self.load.running_decodes += 1
        self.decoding = True

    def release(self) -> None:
        load = self.load
        load.in_flight -= 1
        load.pending_prefill_tokens -= self.pending
        self.pending = 0
        if self.decoding:
            load.running_decodes -= 1
            self.decoding = False
