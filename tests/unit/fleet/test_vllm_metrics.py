from fleet.vllm_metrics import parse_engine_metrics

CURRENT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# HELP vllm:num_requests_waiting_by_reason Waiting by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1024.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 512.0
# HELP vllm:num_preemptions_total Preemptions.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="2000"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 0.0
"""

OLDER = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="old"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="old"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="old"} 0.4
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="old"} 100.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="old"} 30.0
"""


def test_current_names_sum_over_engines_and_exact_waiting_name() -> None:
    m = parse_engine_metrics(CURRENT)
    assert m.running == 3.0
    assert m.waiting == 3.0  # not 10: waiting_by_reason is a different metric
    assert m.kv_usage == 0.75
    assert (m.prefix_queries, m.prefix_hits) == (1024.0, 512.0)
    assert m.preemptions == 4.0
    assert (m.block_size, m.num_gpu_blocks, m.enable_prefix_caching) == (16, 2000, True)
    assert m.models == ("m",)


def test_older_names_are_understood() -> None:
    m = parse_engine_metrics(OLDER)
    assert m.running == 1.0
    assert m.kv_usage == 0.4
    assert (m.prefix_queries, m.prefix_hits) == (100.0, 30.0)
    assert m.block_size is None


def test_empty_page_gives_zeros() -> None:
    m = parse_engine_metrics("")
    assert m.running == 0.0 and m.models == ()


ITL = """\
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 3.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 10.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.5
vllm:inter_token_latency_seconds_count{engine="1",model_name="m"} 30.0
vllm:inter_token_latency_seconds_sum{engine="1",model_name="m"} 1.5
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_count{engine="0",model_name="m"} 99.0
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="m"} 99.0
"""


def test_inter_token_latency_sum_and_count_add_over_engines() -> None:
    m = parse_engine_metrics(ITL)
    assert m.itl_sum == 2.0 and m.itl_count == 40.0


def test_inter_token_latency_under_its_older_name() -> None:
    older = (
        'vllm:time_per_output_token_seconds_count{model_name="old"} 4.0\n'
        'vllm:time_per_output_token_seconds_sum{model_name="old"} 0.2\n'
    )
    m = parse_engine_metrics(older)
    assert m.itl_sum == 0.2 and m.itl_count == 4.0
    # Both published (a transition release): the current name's values, not the sum of both.
    both = parse_engine_metrics(ITL + older)
    assert both.itl_sum == 2.0 and both.itl_count == 40.0


def test_inter_token_latency_absent_is_zero() -> None:
    m = parse_engine_metrics(CURRENT)
    assert m.itl_sum == 0.0 and m.itl_count == 0.0


def test_inter_token_latency_of_a_real_vllm_page() -> None:
    from pathlib import Path

    golden = Path(__file__).resolve().parents[2] / "golden" / "vllm-0.32" / "metrics.txt"
    m = parse_engine_metrics(golden.read_text())
    assert m.itl_count == 53.0 and abs(m.itl_sum - 0.8195944850003798) < 1e-12
    # The request counters of the same page: 7 requests, 1867 prompt and 60 output tokens.
    assert m.requests_finished == 7.0
    assert (m.prompt_len_sum, m.prompt_len_count) == (1867.0, 7.0)
    assert (m.output_len_sum, m.output_len_count) == (60.0, 7.0)
    assert m.ttft_count == 7.0 and abs(m.ttft_sum - 0.33795714378356934) < 1e-12


REQUESTS = """\
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2.0
vllm:request_success_total{engine="1",finished_reason="abort",model_name="m"} 1.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{engine="0",le="1000.0",model_name="m"} 9.0
vllm:request_prompt_tokens_sum{engine="0",model_name="m"} 9000.0
vllm:request_prompt_tokens_count{engine="0",model_name="m"} 9.0
vllm:request_prompt_tokens_sum{engine="1",model_name="m"} 500.0
vllm:request_prompt_tokens_count{engine="1",model_name="m"} 1.0
# TYPE vllm:prompt_tokens_cached counter
vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 77.0
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_sum{engine="0",model_name="m"} 900.0
vllm:request_generation_tokens_count{engine="0",model_name="m"} 9.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.5
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="m"} 99.0
"""


def test_request_counters_sum_over_finish_reasons_and_engines() -> None:
    m = parse_engine_metrics(REQUESTS)
    assert m.requests_finished == 10.0  # 7 stop + 2 length + 1 abort; _created left out
    assert (m.prompt_len_sum, m.prompt_len_count) == (9500.0, 10.0)
    assert (m.output_len_sum, m.output_len_count) == (900.0, 9.0)
    assert (m.ttft_sum, m.ttft_count) == (1.5, 10.0)
    assert (m.itl_sum, m.itl_count) == (0.0, 0.0)  # the per-request TPOT is not the ITL


def test_request_counters_default_to_zero_when_absent() -> None:
    m = parse_engine_metrics(CURRENT)
    assert m.requests_finished == 0.0
    assert (m.prompt_len_count, m.output_len_count) == (0.0, 0.0)
    assert (m.ttft_sum, m.ttft_count) == (0.0, 0.0)  # CURRENT publishes a zero count
