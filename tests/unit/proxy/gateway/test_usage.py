"""The usage read from an answer's last pieces."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from proxy.gateway.usage import UsageMetrics, usage_of


def test_the_last_usage_object_of_a_stream_or_an_answer() -> None:
    stream = (
        b'data: {"choices":[{"text":"x"}],"usage":null}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"total_tokens":12,'
        b'"completion_tokens":7}}\n\ndata: [DONE]\n\n'
    )
    assert usage_of(stream) == {"prompt_tokens": 5, "completion_tokens": 7}
    answer = b'{"choices":[],"usage":{"prompt_tokens": 3, "completion_tokens": 9},"x":null}'
    assert usage_of(answer) == {"prompt_tokens": 3, "completion_tokens": 9}
    assert usage_of(b'data: {"choices":[{"text":"x"}]}\n\ndata: [DONE]\n\n') == {}


def test_counted_by_endpoint_model_and_kind() -> None:
    registry = CollectorRegistry()
    metrics = UsageMetrics(registry)
    metrics.count("completions", "m", b'{"usage":{"prompt_tokens":2,"completion_tokens":4}}')
    metrics.count("completions", "m", b'{"usage":null}')
    for kind, value in (("prompt", 2), ("completion", 4)):
        labels = {"endpoint": "completions", "model": "m", "kind": kind}
        assert registry.get_sample_value("fleet_proxy_usage_tokens_total", labels) == value
