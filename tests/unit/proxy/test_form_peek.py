"""Reading an upload's `model` field as its bytes arrive, however they are split, without
keeping the file's bytes."""

from __future__ import annotations

import httpx
import pytest

from proxy.errors import ProxyError
from proxy.request.form_peek import MAX_FIELD_BYTES, FieldPeek, form_boundary

WANTED = frozenset({"model"})


def sdk_body(**data: str) -> tuple[bytes, bytes]:
    """A body as httpx (the openai SDK's transport) writes it: fields, then the file."""
    req = httpx.Request(
        "POST", "http://x/", data=data, files={"file": ("a.wav", b"\x00" * 50_000, "audio/wav")}
    )
    return req.read(), form_boundary(req.headers["content-type"])


@pytest.mark.parametrize("step", [1, 7, 64, 100_000])
def test_the_model_is_found_before_the_file_however_the_bytes_are_split(step: int) -> None:
    body, boundary = sdk_body(model="whisper", language="en")
    peek = FieldPeek(boundary, WANTED)
    fed = 0
    while not peek.done:
        peek.feed(body[fed : fed + step])
        fed += step
    assert peek.values == {"model": "whisper"}
    assert fed < 1000 or step == 100_000  # long before the file's 50,000 bytes


def test_a_file_part_named_model_is_not_the_field() -> None:
    req = httpx.Request("POST", "http://x/", files={"model": ("m.bin", b"zz")})
    peek = FieldPeek(form_boundary(req.headers["content-type"]), WANTED)
    peek.feed(req.read())
    assert not peek.done and peek.values == {}


def test_a_body_that_is_not_multipart_is_refused() -> None:
    with pytest.raises(ProxyError) as e:
        form_boundary("application/json")
    assert e.value.status == 400
    peek = FieldPeek(b"abc", WANTED)
    with pytest.raises(ProxyError) as e:
        peek.feed(b"not a multipart body at all\r\n\r\n")
    assert e.value.status == 400


def test_an_overlong_field_is_refused() -> None:
    body, boundary = sdk_body(model="m" * (MAX_FIELD_BYTES + 1))
    with pytest.raises(ProxyError) as e:
        FieldPeek(boundary, WANTED).feed(body)
    assert e.value.status == 400 and e.value.param == "model"
