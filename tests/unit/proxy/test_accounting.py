"""One request's accounting on the backends it runs on: charged, moved, released once."""

from fleet.types import Load
from proxy.backends.accounting import Dispatch


def test_a_dispatch_moves_between_backends_and_releases_once() -> None:
    a, b = Load(), Load()
    d = Dispatch(a, 100)
    assert (a.in_flight, a.pending_prefill_tokens, a.running_decodes) == (1, 100, 0)
    d.first_token()
    assert (a.in_flight, a.pending_prefill_tokens, a.running_decodes) == (1, 0, 1)
    d.move(b, 140)  # continued elsewhere: the target prefills prompt + generated tokens
    assert (a.in_flight, a.pending_prefill_tokens, a.running_decodes) == (0, 0, 0)
    assert (b.in_flight, b.pending_prefill_tokens, b.running_decodes) == (1, 140, 0)
    assert b.dispatched_total == 1
    d.first_token()
    d.first_token()  # a second first output of the same leg counts nothing more
    assert (b.pending_prefill_tokens, b.running_decodes) == (0, 1)
    d.release()
    d.release()
    assert (b.in_flight, b.pending_prefill_tokens, b.running_decodes) == (0, 0, 0)


def test_an_empty_dispatch_can_be_charged_later() -> None:
    load = Load()
    d = Dispatch(None, 0)
    d.release()  # nothing charged: nothing to give back
    assert load.in_flight == 0
    d.charge(load, 7)
    assert (load.in_flight, load.pending_prefill_tokens) == (1, 7)
    d.prefilled()
    d.release()
    assert (load.in_flight, load.pending_prefill_tokens) == (0, 0)
