"""tests/waiting.py, the one way the suite waits: it returns what the condition found,
and a wait that times out fails naming what it waited for."""
from __future__ import annotations

import asyncio
import itertools

import pytest

from waiting import wait_until, wait_until_async


def test_returns_the_first_truthy_value():
    calls = itertools.count(1)
    assert wait_until(lambda: next(calls) >= 3 and "ready", 5, "the third call") == "ready"
    assert next(calls) == 4  # polled exactly until it held


def test_a_timeout_names_what_was_awaited_and_the_last_value():
    with pytest.raises(AssertionError, match=r"timed out after 0\.05s waiting for the moon "
                                             r"\(last value: \[\]\)"):
        wait_until(lambda: [], 0.05, "the moon")


def test_a_condition_that_holds_at_once_is_not_timed_out_by_a_zero_budget():
    assert wait_until(lambda: 7, 0, "a held condition") == 7


def test_the_async_twin_awaits_awaitable_conditions_and_lets_the_loop_run():
    async def main():
        state = {"n": 0}

        async def bump():
            while state["n"] < 3:
                state["n"] += 1
                await asyncio.sleep(0)
        task = asyncio.create_task(bump())

        async def reached():
            return state["n"] >= 3 and state["n"]
        got = await wait_until_async(reached, 5, "the task to count to 3", interval=0)
        await task
        with pytest.raises(AssertionError, match="waiting for never"):
            await wait_until_async(lambda: False, 0.02, "never")
        return got
    assert asyncio.run(main()) == 3
