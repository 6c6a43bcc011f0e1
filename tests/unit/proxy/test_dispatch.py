"""Dispatch's accounting on a backend's Load, step by step."""

import pytest

from fleet.types import Load
from proxy.backends.accounting import Dispatch


def counts(load: Load) -> tuple[int, int, int, int]:
    return (load.in_flight, load.pending_prefill_tokens, load.running_decodes,
            load.dispatched_total)  # fmt: skip


def test_prefilled_then_release_before_any_token() -> None:
    load = Load(in_flight=2, pending_prefill_tokens=10, running_decodes=1, dispatched_total=5)
    d = Dispatch(load, 30)
    assert counts(load) == (3, 40, 1, 6)
    d.prefilled()
    d.prefilled()  # twice: the tokens left pending once
    assert counts(load) == (3, 10, 1, 6)
    d.release()
    d.release()  # idempotent
    assert counts(load) == (2, 10, 1, 6)  # the others' counts untouched, the total kept


def test_release_while_still_pending_gives_back_the_prompt() -> None:
    load = Load()
    d = Dispatch(load, 12)
    d.release()
    assert counts(load) == (0, 0, 0, 1)
    d.first_token()  # after release: nothing is counted any more
    assert counts(load) == (0, 0, 0, 1)


def test_charging_a_charged_dispatch_is_refused() -> None:
    load = Load()
    d = Dispatch(load, 1)
    with pytest.raises(AssertionError):
        d.charge(load, 1)
    assert counts(load) == (1, 1, 0, 1)
