"""vllm:lora_requests_info and the prefill histograms, parsed from vLLM's own line format."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from fleet.vllm_metrics import parse_engine_metrics

# A LoRA-enabled vLLM engine's page: one series per label combination it ever reported, each
# valued with the Unix time it was last set; the latest (largest) is the current state.
LORA_PAGE = """\
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7453101559011748e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.7453101607372339e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="math-lora"} 1.745310162193042e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="chat-lora",waiting_lora_adapters=""} 1.7453101612543452e+09
"""


def test_the_page_is_what_vllms_gauge_declaration_renders() -> None:
    """The fixture above is prometheus_client's rendering of the gauge as vLLM declares it
    (label names max_lora, waiting_lora_adapters, running_lora_adapters; set_to_current_time):
    labels sorted by name, as on the real vLLM 0.32 page (tests/golden/vllm-0.32), so the
    parser is tested against the real format, not a guess of it."""
    registry = CollectorRegistry()
    gauge = Gauge(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        registry=registry,
    )
    for line in LORA_PAGE.splitlines()[2:]:
        labels, value = line.split("} ")
        pairs = dict(p.split("=", 1) for p in labels.split("{", 1)[1].split('",'))
        clean = {k: v.strip('"') for k, v in pairs.items()}
        gauge.labels(**clean).set(float(value))
    rendered = generate_latest(registry).decode()
    assert sorted(rendered.splitlines()) == sorted(LORA_PAGE.splitlines())


def test_latest_series_gives_running_waiting_and_max_lora() -> None:
    m = parse_engine_metrics(LORA_PAGE)
    assert m.lora_running == ("sql-lora", "chat-lora")
    assert m.lora_waiting == ("math-lora",)
    assert m.max_lora == 2


def test_latest_series_wins_wherever_it_stands_on_the_page() -> None:
    lines = LORA_PAGE.splitlines()
    reordered = "\n".join([*lines[:2], lines[4], lines[2], lines[3], lines[5]]) + "\n"
    m = parse_engine_metrics(reordered)
    assert m.lora_running == ("sql-lora", "chat-lora")


def test_an_idle_latest_report_has_no_adapters() -> None:
    page = """\
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="1",running_lora_adapters="a",waiting_lora_adapters=""} 100.0
vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 200.0
"""
    m = parse_engine_metrics(page)
    assert (m.lora_running, m.lora_waiting, m.max_lora) == ((), (), 1)


def test_no_lora_metric_means_no_lora_state() -> None:
    m = parse_engine_metrics("# TYPE vllm:num_requests_running gauge\n")
    assert (m.lora_running, m.lora_waiting, m.max_lora) == ((), (), None)


def test_prefill_histograms_of_a_real_vllm_page() -> None:
    from pathlib import Path

    golden = Path(__file__).resolve().parents[2] / "golden" / "vllm-0.32" / "metrics.txt"
    m = parse_engine_metrics(golden.read_text())
    assert m.prefill_time_count == 7.0 and abs(m.prefill_time_sum - 0.24843178499986607) < 1e-12
    assert (m.prefill_computed_sum, m.prefill_computed_count) == (843.0, 7.0)
