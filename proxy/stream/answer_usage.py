"""The token counts of a whole JSON answer's `usage`, read when the request ends (by the
request log and the rate limits) without parsing the answer."""

from __future__ import annotations

import re

_USAGE = re.compile(rb'"(prompt_tokens|completion_tokens)"\s*:\s*(\d+)')


def usage_counts(answer: bytes) -> dict[str, int]:
    """`prompt_tokens` and `completion_tokens` of the answer's last `usage`, those present."""
    at = answer.rfind(b'"usage"')
    if at < 0:
        return {}
    return {name.decode(): int(value) for name, value in _USAGE.findall(answer, at)}
