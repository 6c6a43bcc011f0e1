"""The token usage of answers that pass through the gateway, read from their last pieces: the
`usage` object of a JSON answer, or of a stream's last event (vLLM sends it when the request
asked for `stream_options.include_usage`). Counted as `fleet_proxy_usage_tokens_total`.

Only the answer's last pieces are read, once, at its end: nothing per piece but keeping a
reference to it."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter

_USAGE = re.compile(rb'"(prompt_tokens|completion_tokens)"\s*:\s*(\d+)')


def usage_of(tail: bytes) -> dict[str, int]:
    """`prompt_tokens` and `completion_tokens` of the last `usage` object in `tail` (either may
    be missing; empty when there is no usage)."""
    at = tail.rfind(b'"usage"')
    if at < 0:
        return {}
    return {name.decode(): int(value) for name, value in _USAGE.findall(tail, at)}


class UsageMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.tokens = Counter(
            "fleet_proxy_usage_tokens",
            "Tokens of the answers the gateway passed, by their usage (kind: prompt, completion)",
            ["endpoint", "model", "kind"],
            registry=registry,
        )

    def count(self, endpoint: str, model: str, tail: bytes) -> None:
        usage = usage_of(tail)
        prompt = usage.get("prompt_tokens")
        if prompt is not None:
            self.tokens.labels(endpoint, model, "prompt").inc(prompt)
        completion = usage.get("completion_tokens")
        if completion is not None:
            self.tokens.labels(endpoint, model, "completion").inc(completion)
