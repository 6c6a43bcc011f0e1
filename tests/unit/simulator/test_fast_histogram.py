import re

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from simulator.fast_histogram import FastHistogram

BUCKETS = [0.01, 0.025, 0.05, 1.0]
VALUES = [0.005, 0.01, 0.02, 0.025, 0.5, 3.0, 0.01000001, 0.0]


def _without_created_values(page: bytes) -> str:
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1", page.decode())


def test_renders_exactly_like_prometheus_client_histogram() -> None:
    reference_registry, fast_registry = CollectorRegistry(), CollectorRegistry()
    reference = Histogram(
        "vllm:x", "doc", ["model_name", "engine"], buckets=BUCKETS, registry=reference_registry
    ).labels("m", "0")
    fast = FastHistogram(
        "vllm:x", "doc", ["model_name", "engine"], ["m", "0"], BUCKETS, fast_registry
    )
    for v in VALUES:
        reference.observe(v)
        fast.observe(v)
    want = _without_created_values(generate_latest(reference_registry))
    assert _without_created_values(generate_latest(fast_registry)) == want
    assert 'le="0.01",model_name="m"} 3.0' in want  # bounds are inclusive
