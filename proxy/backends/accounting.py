"""The proxy's per-backend accounting for one client request.

Charged at dispatch (in flight, pending prefill tokens), moved at the first token (pending ->
decoding), moved whole to another backend when the request moves, and released exactly once
at the end, whatever way the request ends (`release` is idempotent).
"""

from __future__ import annotations

from fleet.types import Load


class Dispatch:
    __slots__ = ("decoding", "load", "pending")

    def __init__(self, load: Load | None, prompt_tokens: int) -> None:
        self.load: Load | None = None
        self.pending = 0
        self.decoding = False
        if load is not None:
            self.charge(load, prompt_tokens)

    def charge(self, load: Load, prompt_tokens: int) -> None:
        """Count this request on `load` (after a `release`, or for the first time)."""
        assert self.load is None, "charge() on a dispatch that is still charged"
        self.load = load
        self.pending = prompt_tokens
        load.in_flight += 1
        load.pending_prefill_tokens += prompt_tokens
        load.dispatched_total += 1

    def move(self, load: Load, prompt_tokens: int) -> None:
        """The request continues on another backend, which computes `prompt_tokens` first."""
        self.release()
        self.charge(load, prompt_tokens)

    def prefilled(self) -> None:
        """The prompt is processed: its tokens are no longer pending."""
        if self.load is not None:
            self.load.pending_prefill_tokens -= self.pending
        self.pending = 0

    def first_token(self) -> None:
        self.prefilled()
        if self.load is not None and not self.decoding:
            self.load.running_decodes += 1
            self.decoding = True

    def release(self) -> None:
        load = self.load
        if load is None:
            return
        self.load = None
        load.in_flight -= 1
        load.pending_prefill_tokens -= self.pending
        self.pending = 0
        if self.decoding:
            load.running_decodes -= 1
            self.decoding = False
