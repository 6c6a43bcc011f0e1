"""Validation of request bodies before routing."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import ProxyError
from proxy.request.body import MAX_NESTING, parse_object


def nested(levels: int, *, arrays: bool) -> bytes:
    """A request object whose "user" field brings the nesting to `levels` in all."""
    inner = levels - 1
    value = b"[" * inner + b"]" * inner if arrays else b'{"a":' * inner + b"1" + b"}" * inner
    return b'{"model": "m", "prompt": "x", "user": ' + value + b"}"


@pytest.mark.parametrize("arrays", [True, False])
def test_a_body_nested_as_deep_as_allowed_is_taken_and_can_be_written_again(arrays: bool) -> None:
    parsed = parse_object(nested(MAX_NESTING, arrays=arrays))
    # What the proxy does with a body it rewrites (a field added): it must not fail.
    assert orjson.loads(orjson.dumps({**parsed, "return_token_ids": True}))["model"] == "m"


@pytest.mark.parametrize("levels", [MAX_NESTING + 1, 254, 600])
@pytest.mark.parametrize("arrays", [True, False])
def test_a_body_nested_deeper_is_refused_with_a_400(levels: int, arrays: bool) -> None:
    with pytest.raises(ProxyError) as info:
        parse_object(nested(levels, arrays=arrays))
    assert info.value.status == 400
    assert f"deeper than {MAX_NESTING} levels" in info.value.message


def test_many_brackets_that_do_not_nest_are_fine() -> None:
    body = orjson.dumps({"model": "m", "prompt": [[1]] * 500, "stop": ["[{" * 300]})
    assert len(parse_object(body)["prompt"]) == 500
