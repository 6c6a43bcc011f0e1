"""LoRA adapters in the simulated engine: the max_loras slot limit, per-adapter prefix cache,
the request parser, and vllm:lora_requests_info read back by the router's parser."""

from __future__ import annotations

import pytest

from fleet.vllm_metrics import parse_engine_metrics
from simulator.core import CoreListener, EngineCore
from simulator.lora import LoraConfig, parse_lora_modules
from simulator.metrics import SimMetrics
from simulator.openai_api import COMPLETIONS, ApiError, parse_request
from simulator.request import SimRequest, Status
from simulator.tokenizer import Tokenizer
from tests.unit.simulator.conftest import CoreHarness, small_profile


class Recorder(CoreListener):
    def __init__(self) -> None:
        self.states: list[tuple[list[str], list[str]]] = []

    def on_lora_state(self, running: list[str], waiting: list[str]) -> None:
        self.states.append((running, waiting))


def lora_harness(tokenizer: Tokenizer, max_loras: int) -> tuple[CoreHarness, Recorder]:
    h = CoreHarness(tokenizer, max_num_batched_tokens=64, num_gpu_blocks=64)
    rec = Recorder()
    h.core = EngineCore(h.profile, tokenizer, h.lm, rec, max_loras=max_loras)
    return h, rec


def adapter_request(h: CoreHarness, lora: str | None, prompt: list[int], n: int) -> SimRequest:
    req = h.request(prompt, max_tokens=n)
    req.lora = lora
    return req


def test_parse_lora_modules() -> None:
    cfg = parse_lora_modules(["sql=/m/sql", "chat=/m/chat"], max_loras=2)
    assert dict(cfg.adapters) == {"sql": "/m/sql", "chat": "/m/chat"}
    assert cfg.max_loras == 2 and cfg.enabled
    assert not LoraConfig().enabled
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_lora_modules(["sql"])
    with pytest.raises(ValueError, match="max-loras"):
        parse_lora_modules(["a=b"], max_loras=0)


def test_a_second_adapter_waits_for_a_free_slot_and_others_go_past_it(
    tokenizer: Tokenizer,
) -> None:
    h, rec = lora_harness(tokenizer, max_loras=1)
    a1 = adapter_request(h, "a", [10, 11, 12], 3)
    b = adapter_request(h, "b", [20, 21, 22], 3)
    a2 = adapter_request(h, "a", [30, 31, 32], 3)
    base = adapter_request(h, None, [40, 41, 42], 3)
    h.step()
    # b is skipped (a holds the only slot); a2 and the base-model request are admitted past it
    assert [r.status for r in (a1, b, a2, base)] == [
        Status.RUNNING,
        Status.WAITING,
        Status.RUNNING,
        Status.RUNNING,
    ]
    assert rec.states[0] == (["a"], ["b"])
    h.run()
    assert all(len(r.output_ids) == 3 for r in (a1, b, a2, base))
    assert (["b"], []) in rec.states  # b ran once a's requests finished


def test_two_slots_take_two_adapters_at_once(tokenizer: Tokenizer) -> None:
    h, rec = lora_harness(tokenizer, max_loras=2)
    a = adapter_request(h, "a", [10, 11, 12], 2)
    b = adapter_request(h, "b", [20, 21, 22], 2)
    c = adapter_request(h, "c", [30, 31, 32], 2)
    h.step()
    assert [r.status for r in (a, b, c)] == [Status.RUNNING, Status.RUNNING, Status.WAITING]
    assert rec.states[0] == (["a", "b"], ["c"])


def test_lora_off_reports_nothing_and_limits_nothing(tokenizer: Tokenizer) -> None:
    h = CoreHarness(tokenizer, max_num_batched_tokens=64, num_gpu_blocks=64)
    rec = Recorder()
    h.core = EngineCore(h.profile, tokenizer, h.lm, rec)
    reqs = [adapter_request(h, name, [i, i + 1, i + 2], 2) for i, name in enumerate("abc")]
    h.step()
    assert all(r.status is Status.RUNNING for r in reqs)
    assert rec.states == []


def test_an_adapter_does_not_hit_the_base_models_prefix_cache(tokenizer: Tokenizer) -> None:
    h, _ = lora_harness(tokenizer, max_loras=1)
    prompt = list(range(100, 117))  # four full blocks of 4, and one token
    adapter_request(h, None, prompt, 1)
    h.run()
    first = adapter_request(h, "a", prompt, 1)
    h.run()
    again = adapter_request(h, "a", prompt, 1)
    h.run()
    assert first.prefix_hit_tokens == 0
    assert again.prefix_hit_tokens == 16


def test_the_metric_reads_back_through_the_routers_parser(tokenizer: Tokenizer) -> None:
    cfg = LoraConfig({"a": "/a", "b": "/b"}, max_loras=1)
    metrics = SimMetrics("base", small_profile(), lora=cfg)
    h = CoreHarness(tokenizer, max_num_batched_tokens=64, num_gpu_blocks=64)
    h.core = EngineCore(h.profile, tokenizer, h.lm, metrics, max_loras=1)
    adapter_request(h, "a", [10, 11, 12], 5)
    adapter_request(h, "b", [20, 21, 22], 5)
    h.step()
    page = metrics.render(h.core).decode()
    assert (
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="a",waiting_lora_adapters="b"}'
        in page
    )
    m = parse_engine_metrics(page)
    assert (m.lora_running, m.lora_waiting, m.max_lora) == (("a",), ("b",), 1)
    h.run()
    m = parse_engine_metrics(metrics.render(h.core).decode())
    assert m.lora_running == ("b",) and m.lora_waiting == ()


def test_no_adapters_no_lora_metric(tokenizer: Tokenizer) -> None:
    metrics = SimMetrics("base", small_profile())
    h = CoreHarness(tokenizer)
    assert "lora_requests_info" not in metrics.render(h.core).decode()


def test_requests_may_name_an_adapter(tokenizer: Tokenizer) -> None:
    body = {"model": "sql", "prompt": "hello", "max_tokens": 2}
    p = parse_request(COMPLETIONS, body, tokenizer, "base", 256, ("sql",))
    assert (p.model, p.lora) == ("sql", "sql")
    p = parse_request(COMPLETIONS, {**body, "model": "base"}, tokenizer, "base", 256, ("sql",))
    assert (p.model, p.lora) == ("base", None)
    with pytest.raises(ApiError) as e:
        parse_request(COMPLETIONS, {**body, "model": "other"}, tokenizer, "base", 256, ("sql",))
    assert e.value.status == 404


def test_cli_takes_lora_modules_as_vllm_does() -> None:
    from simulator.cli import build_parser, main

    args = build_parser().parse_args(["--lora-modules", "sql=/m/sql", "chat=/m/chat"])
    assert (args.lora_modules, args.max_loras) == (["sql=/m/sql", "chat=/m/chat"], 1)
    assert main(["--lora-modules", "sql"]) == 2
    assert main(["--lora-modules", "a=b", "--max-loras", "0"]) == 2
