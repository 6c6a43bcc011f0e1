"""The token counts of a whole JSON answer's `usage`, read when the request ends (by the
request log and the rate limits) without parsing the answer."""

from __future__ import annotations

import re

_USAGE = re.compile(rb'"(prompt_tokens|completion_tokens|input_tokens|output_tokens)"\s*:\s*(\d+)')
# The Responses and Messages APIs' names for the same counts.
_NAMES = {
    b"prompt_tokens": "prompt_tokens",
    b"completion_tokens": "completion_tokens",
    b"input_tokens": "prompt_tokens",
    b"output_tokens": "completion_tokens",
}


def usage_counts(answer: bytes) -> dict[str, int]:
    """`prompt_tokens` and `completion_tokens` of the answer's last `usage`, those present
    (from `input_tokens` and `output_tokens` in the Responses and Messages APIs' answers)."""
    at = answer.rfind(b'"usage"')
    if at < 0:
        return {}
    return {_NAMES[name]: int(value) for name, value in _USAGE.findall(answer, at)}
