"""A backend's 400 or 404 body in the OpenAI error shape: wrapped unless it already is one."""

from __future__ import annotations

from pathlib import Path

import orjson

from proxy.errors import openai_shaped


def test_fastapi_and_plain_text_404s_are_wrapped_naming_the_backend_and_path() -> None:
    for body, said in (
        (b'{"detail":"Not Found"}', '{"detail":"Not Found"}'),
        (b"404: Not Found", "404: Not Found"),
    ):
        shaped = openai_shaped(404, body, "e1", "/v1/embeddings")
        assert shaped is not None
        error = orjson.loads(shaped)["error"]
        assert error == {
            "message": f"backend e1 does not serve /v1/embeddings: it answered 404 ({said})",
            "type": "not_found_error",
            "param": None,
            "code": 404,
        }
    empty = openai_shaped(404, b"", "e1", "/v1/x")
    assert empty is not None and orjson.loads(empty)["error"]["message"].endswith("answered 404")


def test_an_openai_shaped_404_passes_through() -> None:
    body = orjson.dumps({"error": {"message": "The model `m` does not exist.", "type": "x"}})
    assert openai_shaped(404, body, "e1", "/v1/completions") is None
    # An "error" that is not the OpenAI object is still wrapped.
    assert openai_shaped(404, b'{"error": "Unauthorized"}', "e1", "/v1/completions") is not None


def test_a_plain_text_400_is_wrapped_as_an_invalid_request_and_other_statuses_are_not() -> None:
    shaped = openai_shaped(400, b"Request Header Fields Too Large", "e1", "/v1/completions")
    assert shaped is not None
    assert orjson.loads(shaped)["error"] == {
        "message": "backend e1 refused the request to /v1/completions: it answered 400 "
        "(Request Header Fields Too Large)",
        "type": "invalid_request_error",
        "param": None,
        "code": 400,
    }
    vllm_400 = orjson.dumps({"error": {"message": "max_tokens must be at least 1", "code": 400}})
    assert openai_shaped(400, vllm_400, "e1", "/v1/completions") is None
    assert openai_shaped(422, b"plain", "e1", "/v1/completions") is None


def test_real_vllm_400s_pass_through_untouched() -> None:
    golden = Path(__file__).resolve().parents[2] / "golden" / "vllm-0.32"
    body = (golden / "error_prompt_too_long.json").read_bytes()
    assert openai_shaped(400, body, "e1", "/v1/completions") is None
