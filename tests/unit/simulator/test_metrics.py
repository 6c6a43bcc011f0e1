"""The /metrics page carries vLLM's names, labels and series shapes."""

from prometheus_client.parser import text_string_to_metric_families

from simulator.core import EngineCore
from simulator.lm import DeterministicLM
from simulator.metrics import SimMetrics, buckets_1_2_5
from simulator.tokenizer import Tokenizer
from tests.unit.simulator.conftest import small_profile

ROUTER_METRICS = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:cache_config_info": "gauge",
}


def _page(tokenizer: Tokenizer) -> str:
    profile = small_profile()
    metrics = SimMetrics("sim-x", profile)
    core = EngineCore(profile, tokenizer, DeterministicLM(tokenizer.generatable), metrics)
    return metrics.render(core).decode()


def test_router_relevant_families_have_vllm_names_and_types(tokenizer: Tokenizer) -> None:
    families = {f.name: f for f in text_string_to_metric_families(_page(tokenizer))}
    for name, kind in ROUTER_METRICS.items():
        assert name in families, name
        assert families[name].type == kind, name


def test_every_series_has_model_and_engine_labels(tokenizer: Tokenizer) -> None:
    for fam in text_string_to_metric_families(_page(tokenizer)):
        for s in fam.samples:
            # As in vLLM: admission rejections are per server, cache info per engine.
            if not fam.name.startswith("vllm:admission_rejections"):
                assert s.labels.get("engine") == "0", s
            if not fam.name.startswith("vllm:cache_config_info"):
                assert s.labels.get("model_name") == "sim-x", s


def test_cache_config_info_describes_the_cache(tokenizer: Tokenizer) -> None:
    page = _page(tokenizer)
    info = next(
        f for f in text_string_to_metric_families(page) if f.name == "vllm:cache_config_info"
    )
    labels = info.samples[0].labels
    assert labels["block_size"] == "4" and labels["num_gpu_blocks"] == "16"
    assert labels["enable_prefix_caching"] == "True"
    assert "vllm:prefix_cache_hits_total{" in page


def test_token_buckets_follow_1_2_5() -> None:
    assert buckets_1_2_5(100) == [1, 2, 5, 10, 20, 50, 100]


def test_inter_token_latency_reaches_the_routers_parser(tokenizer: Tokenizer) -> None:
    from fleet.vllm_metrics import parse_engine_metrics

    profile = small_profile()
    metrics = SimMetrics("sim-x", profile)
    core = EngineCore(profile, tokenizer, DeterministicLM(tokenizer.generatable), metrics)
    metrics.itl.observe(0.02)
    metrics.itl.observe(0.04)
    parsed = parse_engine_metrics(metrics.render(core).decode())
    assert parsed.itl_count == 2.0 and abs(parsed.itl_sum - 0.06) < 1e-9


def test_request_counters_reach_the_routers_parser(tokenizer: Tokenizer) -> None:
    from fleet.vllm_metrics import parse_engine_metrics

    profile = small_profile()
    metrics = SimMetrics("sim-x", profile)
    core = EngineCore(profile, tokenizer, DeterministicLM(tokenizer.generatable), metrics)
    metrics.success["stop"].inc()
    metrics.success["length"].inc()
    for prompt, output, ttft in ((1000, 100, 0.25), (3000, 50, 0.5)):
        metrics.req_prompt_tokens.observe(prompt)
        metrics.req_generation_tokens.observe(output)
        metrics.ttft.observe(ttft)
    parsed = parse_engine_metrics(metrics.render(core).decode())
    assert parsed.requests_finished == 2.0
    assert (parsed.prompt_len_sum, parsed.prompt_len_count) == (4000.0, 2.0)
    assert (parsed.output_len_sum, parsed.output_len_count) == (150.0, 2.0)
    assert (parsed.ttft_sum, parsed.ttft_count) == (0.75, 2.0)
