"""Rendezvous hashing's properties, over fixed keys and ids: deterministic, so no test here can
pass or fail by chance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fleet.types import Backend
from policies.rendezvous import home, key_seed, ranked, weight
from tests.unit.policies.builders import backend

REPO = Path(__file__).resolve().parents[3]
KEYS = [f"session-{i}" for i in range(10_000)]  # sequential keys: the hard case for a weak hash
STATEFUL = [f"vllm-decode-{i}" for i in range(8)]  # a StatefulSet's pods
DEPLOYMENT = [  # a Deployment's pods
    "vllm-7d9f8b6c5-x2x9k",
    "vllm-7d9f8b6c5-4qzlm",
    "vllm-7d9f8b6c5-hh7tw",
    "vllm-7d9f8b6c5-p9v2c",
    "vllm-7d9f8b6c5-wk5rd",
    "vllm-7d9f8b6c5-b8n6f",
    "vllm-7d9f8b6c5-zt3jq",
    "vllm-7d9f8b6c5-m4cxs",
]
# Chi-square's critical values at p = 0.001: a fair spread exceeds them once in a thousand.
CHI2_999 = {6: 22.46, 7: 24.32}


def homes(ids: list[str], keys: list[str] = KEYS) -> dict[str, str]:
    pool = [backend(i) for i in ids]
    return {k: home(k, pool).id for k in keys}


def chi_square(counts: Counter[str], cells: list[str]) -> float:
    expected = sum(counts.values()) / len(cells)
    return sum((counts[c] - expected) ** 2 / expected for c in cells)


def test_the_weights_are_pinned() -> None:
    # Replicas of two versions run side by side during a rollout: a change of hash would send
    # every session to a different backend on each, so it must be a deliberate one.
    assert weight(key_seed("alice"), "vllm-0") == 15808764126963028760
    assert weight(key_seed("s-1"), "vllm-0") == 7719395438350886241
    pool = [backend(f"vllm-{i}") for i in range(4)]
    assert [b.id for b in ranked("alice", pool)] == ["vllm-0", "vllm-2", "vllm-1", "vllm-3"]
    assert [b.id for b in ranked("s-1", pool)] == ["vllm-2", "vllm-0", "vllm-1", "vllm-3"]


def test_every_process_finds_the_same_homes() -> None:
    # Another interpreter with another string-hash salt: nothing may depend on hash().
    keys = KEYS[:300]
    script = (
        "import json, sys; from policies.rendezvous import home; "
        "from tests.unit.policies.builders import backend; "
        "ids, keys = json.load(sys.stdin); pool = [backend(i) for i in ids]; "
        "print(json.dumps({k: home(k, pool).id for k in keys}))"
    )
    for salt in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", script],
            input=json.dumps([STATEFUL, keys]),
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": salt},
            check=True,
            timeout=60,
        )
        assert json.loads(out.stdout) == homes(STATEFUL, keys)


def test_the_home_does_not_depend_on_the_candidates_order() -> None:
    pool = [backend(i) for i in STATEFUL]
    backwards = pool[::-1]
    rotated = pool[3:] + pool[:3]
    for k in KEYS[:500]:
        assert home(k, pool) is home(k, backwards) is home(k, rotated)


def test_ranked_starts_at_the_home_and_falls_through_in_order() -> None:
    pool = [backend(i) for i in STATEFUL]
    for k in KEYS[:500]:
        order = ranked(k, pool)
        assert order[0] is home(k, pool)
        assert sorted(b.id for b in order) == sorted(STATEFUL)
        assert home(k, order[1:]) is order[1]
        assert ranked(k, order[2:]) == order[2:]


def test_odd_keys_hash() -> None:
    pool = [backend(i) for i in STATEFUL]
    for k in ("", "é", "\ud800", "x" * 10_000):  # a lone surrogate can come from a JSON body
        assert home(k, pool) is ranked(k, pool)[0]


def test_no_candidates_is_an_error() -> None:
    with pytest.raises(ValueError):
        home("k", [])


@pytest.mark.parametrize("ids", [STATEFUL, DEPLOYMENT], ids=["statefulset", "deployment"])
def test_keys_spread_evenly(ids: list[str]) -> None:
    counts = Counter(homes(ids).values())
    assert chi_square(counts, ids) < CHI2_999[len(ids) - 1], counts
    mean = len(KEYS) / len(ids)
    assert max(counts.values()) / mean < 1.1, counts


@pytest.mark.parametrize("ids", [STATEFUL, DEPLOYMENT], ids=["statefulset", "deployment"])
def test_a_leaving_backend_moves_only_its_keys_each_to_its_next_ranked(ids: list[str]) -> None:
    before = homes(ids)
    gone = ids[2]
    rest = [i for i in ids if i != gone]
    after = homes(rest)
    pool = [backend(i) for i in ids]
    moved: Counter[str] = Counter()
    for k in KEYS:
        if before[k] == gone:
            assert after[k] == ranked(k, pool)[1].id
            moved[after[k]] += 1
        else:
            assert after[k] == before[k]
    # Spread over every other backend, not piled on one as on a hash ring.
    assert chi_square(moved, rest) < CHI2_999[len(rest) - 1], moved


@pytest.mark.parametrize("ids", [STATEFUL, DEPLOYMENT], ids=["statefulset", "deployment"])
def test_a_joining_backend_takes_about_its_share_and_nothing_else_moves(ids: list[str]) -> None:
    before = homes(ids)
    new = "vllm-new-0"
    after = homes([*ids, new])
    moved = [k for k in KEYS if after[k] != before[k]]
    assert all(after[k] == new for k in moved)
    share = 1 / (len(ids) + 1)  # 1/9; the binomial's sd over 10,000 keys is 0.0031
    assert abs(len(moved) / len(KEYS) - share) < 0.015, len(moved)


def test_backends_are_told_apart_by_id_not_by_object() -> None:
    # A backend re-created under the same id (its pod restarted) is the same home.
    first: list[Backend] = [backend(i) for i in STATEFUL]
    again: list[Backend] = [backend(i) for i in STATEFUL]
    for k in KEYS[:200]:
        assert home(k, first).id == home(k, again).id
