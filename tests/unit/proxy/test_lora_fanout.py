"""The decisions of a fleet-wide LoRA load or unload: which engines it goes to, its answer's
status, and what an engine that (re)joined still lacks."""

from __future__ import annotations

import pytest

from proxy.control.lora_fanout import (
    RETRY_AFTER_S,
    Adapter,
    Engine,
    Outcome,
    base_model,
    missing,
    plan_load,
    plan_unload,
    remembered_after_load,
    verdict,
)
from proxy.errors import ProxyError

A = Engine("a", ("llama",), frozenset())
B = Engine("b", ("llama", "sql"), frozenset({"sql"}))
C = Engine("c", ("qwen",), frozenset())
FLEET = [A, B, C]


def test_the_base_model_is_the_one_asked_or_the_fleets_only_one() -> None:
    assert base_model("qwen", FLEET) == "qwen"
    assert base_model(None, [A, B]) == "llama"
    with pytest.raises(ProxyError) as e:
        base_model(None, FLEET)
    assert e.value.status == 400 and "llama, qwen" in e.value.message
    with pytest.raises(ProxyError) as e:
        base_model("sql", FLEET)  # an adapter is no base model
    assert e.value.status == 404


def test_a_load_asks_the_engines_serving_the_base_that_lack_the_adapter() -> None:
    plan = plan_load("sql", "llama", FLEET, None)
    assert plan.call == ["a"] and plan.already == ["b"]
    assert plan_load("sql", "llama", FLEET, ["a"]).call == ["a"]
    with pytest.raises(ProxyError) as e:
        plan_load("sql", "llama", FLEET, ["zz"])
    assert e.value.status == 400 and "zz" in e.value.message
    with pytest.raises(ProxyError):
        plan_load("sql", "llama", FLEET, ["c"])  # c serves another base


def test_an_unload_asks_the_engines_listing_the_adapter() -> None:
    assert plan_unload("sql", FLEET, None) == ["b"]
    with pytest.raises(ProxyError) as e:
        plan_unload("nope", FLEET, None)
    assert e.value.status == 404


def test_the_answer_is_200_all_207_some_502_none() -> None:
    ok, failed = Outcome("a", True, 200, "ok"), Outcome("b", False, None, "refused")
    assert verdict([ok, ok]) == 200
    assert verdict([ok, failed]) == 207
    assert verdict([failed, failed]) == 502


def test_a_joining_engine_lacks_the_remembered_adapters_of_its_base() -> None:
    sql = Adapter("sql", "/p/sql", "llama")
    only_b = Adapter("chat", "/p/chat", "llama", frozenset({"b"}))
    other = Adapter("q", "/p/q", "qwen")
    remembered = [sql, only_b, other]
    assert missing(A, remembered, {}, 0.0) == [sql]
    assert missing(B, remembered, {}, 0.0) == [only_b]  # lists sql already
    assert missing(C, remembered, {}, 0.0) == [other]
    asked = {("a", "sql"): 100.0}
    assert missing(A, remembered, asked, 100.0 + RETRY_AFTER_S - 1) == []
    assert missing(A, remembered, asked, 100.0 + RETRY_AFTER_S) == [sql]


def test_an_unload_by_name_keeps_those_engines_from_getting_it_again() -> None:
    sql = remembered_after_load(None, "sql", "/p/sql", "llama", None)
    assert sql == Adapter("sql", "/p/sql", "llama")
    without_a = sql.unloaded_from(["a"])
    assert missing(A, [without_a], {}, 0.0) == []
    other = Engine("d", ("llama",), frozenset())
    assert missing(other, [without_a], {}, 0.0) == [without_a]
    # Loaded on `a` by name again: it is `a`'s again, the rest as before.
    back = remembered_after_load(without_a, "sql", "/p/sql2", "llama", ["a"])
    assert back.excluded == frozenset() and back.backends is None and back.path == "/p/sql2"
    # Loaded by name first: only those engines keep it; a later load everywhere widens it.
    only_b = remembered_after_load(None, "chat", "/p/chat", "llama", ["b"])
    assert only_b.backends == frozenset({"b"})
    assert remembered_after_load(only_b, "chat", "/p/chat", "llama", None).backends is None
