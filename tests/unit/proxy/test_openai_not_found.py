"""A backend's 404 body in the OpenAI error shape: wrapped unless it already is one."""

from __future__ import annotations

import orjson

from proxy.errors import openai_not_found


def test_fastapi_and_plain_text_404s_are_wrapped_naming_the_backend_and_path() -> None:
    for body, said in (
        (b'{"detail":"Not Found"}', '{"detail":"Not Found"}'),
        (b"404: Not Found", "404: Not Found"),
    ):
        shaped = openai_not_found(body, "e1", "/v1/embeddings")
        assert shaped is not None
        error = orjson.loads(shaped)["error"]
        assert error == {
            "message": f"backend e1 does not serve /v1/embeddings: it answered 404 ({said})",
            "type": "not_found_error",
            "param": None,
            "code": 404,
        }
    empty = openai_not_found(b"", "e1", "/v1/x")
    assert empty is not None and orjson.loads(empty)["error"]["message"].endswith("answered 404")


def test_an_openai_shaped_404_passes_through() -> None:
    body = orjson.dumps({"error": {"message": "The model `m` does not exist.", "type": "x"}})
    assert openai_not_found(body, "e1", "/v1/completions") is None
    # An "error" that is not the OpenAI object is still wrapped.
    assert openai_not_found(b'{"error": "Unauthorized"}', "e1", "/v1/completions") is not None
