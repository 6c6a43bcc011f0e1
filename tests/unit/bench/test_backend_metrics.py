import pytest

from bench.backend_metrics import backend_id, deltas, parse_counters, summarize_snapshots

PAGE = """\
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 500.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 100.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
"""

OLD_PAGE = """\
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 2000.0
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 900.0
"""


def test_counters_sum_engines_and_read_old_names() -> None:
    assert parse_counters(PAGE) == {"prefix_queries": 1500.0, "prefix_hits": 400.0}
    assert parse_counters(OLD_PAGE) == {"prefix_queries": 2000.0, "prefix_hits": 900.0}


def test_deltas_and_hit_rate() -> None:
    d = deltas(parse_counters(PAGE), parse_counters(OLD_PAGE))
    assert d["prefix_queries"] == 500.0 and d["prefix_hits"] == 500.0
    assert d["prefix_hit_rate"] == pytest.approx(1.0)


def test_snapshot_summary_totals_and_marks_missing() -> None:
    s = summarize_snapshots({"a:1": PAGE, "b:2": None}, {"a:1": OLD_PAGE, "b:2": PAGE})
    assert s["backends"]["b:2"] == {"error": "metrics unavailable"}
    assert s["prefix_queries"] == 500.0 and s["prefix_hit_rate"] == pytest.approx(1.0)


def test_backend_id_is_host_port() -> None:
    assert backend_id("http://127.0.0.1:8001/") == "127.0.0.1:8001"
    assert backend_id("localhost:9000") == "localhost:9000"
    assert backend_id("https://h.example/v1") == "h.example:443"


def served(requests: int, prompt: int) -> str:
    return (
        "# TYPE vllm:request_success counter\n"
        f'vllm:request_success_total{{finished_reason="stop",model_name="m"}} {requests - 1}\n'
        f'vllm:request_success_total{{finished_reason="length",model_name="m"}} 1\n'
        "# TYPE vllm:prompt_tokens counter\n"
        f'vllm:prompt_tokens_total{{model_name="m"}} {prompt}\n'
    )


def test_balance_from_snapshots_when_no_header_names_the_backend() -> None:
    before = {"a:1": served(1, 0), "b:2": served(1, 0)}
    after = {"a:1": served(31, 3000), "b:2": served(11, 1000)}
    s = summarize_snapshots(before, after)
    assert s["backends"]["a:1"]["delta"]["requests"] == 30
    assert s["requests_max_over_min"] == pytest.approx(3.0)
    assert s["tokens_max_over_min"] == pytest.approx(3.0)
    idle = summarize_snapshots(before, {"a:1": served(31, 3000), "b:2": served(1, 0)})
    assert idle["requests_max_over_min"] is None  # one backend got nothing
