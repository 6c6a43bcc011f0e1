"""The /metrics reader against prometheus_client's parser: the same samples, names, labels and
values, on real vLLM pages and on generated lines with awkward label values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from fleet.vllm_metrics import labels_of, parse_engine_metrics, samples

GOLDEN = Path(__file__).parents[2] / "golden" / "vllm-0.32"


def reader(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(name, labels_of(labels), value) for name, labels, value in samples(text)]


def library(text: str, names: set[str]) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in names
    ]


@pytest.mark.parametrize("page", ["metrics.txt", "pd_prefill_metrics.txt", "pd_decode_metrics.txt"])
def test_a_real_vllm_page_reads_as_the_library_reads_it(page: str) -> None:
    text = (GOLDEN / page).read_text()
    got = reader(text)
    names = {name for name, _, _ in got}
    assert len(got) >= 10
    assert got == library(text, names)
    # And a name that merely starts like a wanted one is not taken for it.
    assert "vllm:num_requests_waiting_by_reason" not in names


LABEL_VALUES = st.text(alphabet=st.sampled_from([*'ab,= {}"\\\n-_.', "é"]), max_size=12)


def escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(LABEL_VALUES, min_size=0, max_size=3),
    number=st.one_of(
        st.floats(allow_nan=False, allow_infinity=True), st.integers(-(10**12), 10**12)
    ),
    timestamp=st.booleans(),
)
def test_generated_samples_read_as_the_library_reads_them(
    values: list[str], number: float, timestamp: bool
) -> None:
    labels = ",".join(f'l{i}="{escaped(v)}"' for i, v in enumerate(values))
    value = repr(float(number)) if not math.isinf(number) else ("+Inf" if number > 0 else "-Inf")
    line = "vllm:num_requests_running" + (f"{{{labels}}}" if values else "") + f" {value}"
    if timestamp:
        line += " 1700000000000"
    text = "# TYPE vllm:num_requests_running gauge\n" + line + "\n"
    assert reader(text) == library(text, {"vllm:num_requests_running"})


def test_escaped_label_values_and_unreadable_values() -> None:
    text = (
        'vllm:lora_requests_info{running_lora_adapters="a,b",waiting_lora_adapters="",'
        'max_lora="2",note="say \\"hi\\"\\nback\\\\slash"} 17.0\n'
        'vllm:num_requests_waiting{engine="0"} not-a-number\n'
        'vllm:num_requests_waiting{engine="1"} 3\n'
    )
    ((name, labels, value), waiting) = reader(text)
    assert name == "vllm:lora_requests_info" and value == 17.0
    assert labels["note"] == 'say "hi"\nback\\slash' and labels["running_lora_adapters"] == "a,b"
    assert waiting == ("vllm:num_requests_waiting", {"engine": "1"}, 3.0)
    m = parse_engine_metrics(text)
    assert m.waiting == 3.0 and m.lora_running == ("a", "b") and m.max_lora == 2
