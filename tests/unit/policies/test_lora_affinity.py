"""lora-affinity-scorer: running > waiting > free slot > full, from vllm:lora_requests_info."""

from __future__ import annotations

import pytest

from fleet.types import EngineMetrics
from fleet.vllm_metrics import parse_engine_metrics
from policies.registry import build_routing
from policies.scorers.lora import lora_affinity
from tests.unit.policies.builders import backend, ctx


def lora(running: tuple[str, ...], waiting: tuple[str, ...], max_lora: int) -> EngineMetrics:
    return EngineMetrics(
        models=("base",), lora_running=running, lora_waiting=waiting, max_lora=max_lora
    )


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        (lora(("sql",), (), 1), 1.0),  # running
        (lora(("chat", "sql"), ("math",), 2), 1.0),
        (lora(("chat",), ("sql",), 1), 0.8),  # waiting for a slot
        (lora(("chat",), (), 2), 0.5),  # a free slot
        (lora((), (), 1), 0.5),
        (lora(("chat",), (), 1), 0.0),  # every slot holds another adapter
        (lora(("chat", "math"), ("x",), 2), 0.0),
        (EngineMetrics(models=("base",)), 0.5),  # no LoRA state published
        (None, 0.5),  # not scraped
    ],
)
def test_adapter_scores(metrics: EngineMetrics | None, expected: float) -> None:
    assert lora_affinity("sql", metrics) == expected


def test_the_base_model_needs_no_adapter() -> None:
    assert lora_affinity("base", lora(("chat",), (), 1)) == 1.0


def test_scores_from_a_scraped_page_pick_the_engine_running_the_adapter() -> None:
    def page(running: str, waiting: str) -> EngineMetrics:
        return parse_engine_metrics(
            "# TYPE vllm:lora_requests_info gauge\n"
            f'vllm:lora_requests_info{{max_lora="1",running_lora_adapters="{running}",'
            f'waiting_lora_adapters="{waiting}"}} 1.7e9\n'
        )

    fleet = [
        backend("full", scraped=page("chat", "")),
        backend("waiting", scraped=page("chat", "sql")),
        backend("running", scraped=page("sql", "")),
        backend("free", scraped=page("", "")),
    ]
    policy = build_routing(
        {
            "plugins": [
                {"type": "lora-affinity-scorer", "name": "lora"},
                {"type": "max-score-picker", "name": "best"},
            ],
            "profiles": [{"name": "default", "scorers": ["lora"], "picker": "best"}],
        }
    )
    c = ctx("x", debug=True)
    c.model = "sql"
    d = policy.pick(c, fleet, 0)
    assert d.target.id == "running"
    assert {b: s["lora"] for b, s in d.scores.items()} == {
        "full": 0.0,
        "waiting": 0.8,
        "running": 1.0,
        "free": 0.5,
    }
