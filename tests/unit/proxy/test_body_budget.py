"""The process-wide budget of request-body bytes: taken, waited for in order, given back."""

from __future__ import annotations

import asyncio
import contextlib

from proxy.request.body_budget import BodyBudget


def test_bytes_are_taken_while_they_fit_and_given_back() -> None:
    budget = BodyBudget(100, wait_s=0)
    assert budget.take_now(60)
    assert not budget.take_now(41)
    assert budget.take_now(40)
    assert budget.held == 100
    budget.release(60)
    assert budget.held == 40


async def test_a_waiter_gets_room_freed_in_time_and_the_line_is_kept_in_order() -> None:
    budget = BodyBudget(100, wait_s=5)
    assert await budget.take(90)
    big = asyncio.create_task(budget.take(80))
    small = asyncio.create_task(budget.take(10))
    await asyncio.sleep(0)
    # The small one would fit now, but waits behind the big one that came first.
    assert not big.done()
    assert not small.done()
    assert not budget.take_now(5)  # nor does a newcomer jump the line
    budget.release(90)
    assert await big
    assert await small
    assert budget.held == 90


async def test_a_waiter_gives_up_after_wait_s_and_takes_nothing() -> None:
    budget = BodyBudget(100, wait_s=0.05)
    assert await budget.take(100)
    assert not await budget.take(1)
    assert budget.held == 100
    budget.release(100)
    assert budget.held == 0
    assert await budget.take(100)


async def test_a_big_waiter_leaving_lets_the_ones_behind_it_in() -> None:
    budget = BodyBudget(100, wait_s=0.05)
    assert await budget.take(50)
    big = asyncio.create_task(budget.take(80))
    await asyncio.sleep(0)
    budget.wait_s = 5
    small = asyncio.create_task(budget.take(30))
    assert not await big  # timed out: the small one behind it fits and gets in
    assert await asyncio.wait_for(small, 1)
    assert budget.held == 80


async def test_a_cancelled_waiter_holds_nothing() -> None:
    budget = BodyBudget(100, wait_s=5)
    assert await budget.take(100)
    waiter = asyncio.create_task(budget.take(50))
    await asyncio.sleep(0)
    budget.release(60)  # room comes for it...
    waiter.cancel()  # ...as its client leaves
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    assert budget.held == 40


def test_a_body_larger_than_the_whole_budget_is_refused_at_once() -> None:
    async def run() -> bool:
        return await BodyBudget(100, wait_s=5).take(101)

    assert asyncio.run(asyncio.wait_for(run(), 1)) is False
