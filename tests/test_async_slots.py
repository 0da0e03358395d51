"""The asyncio Workers' handler slots (asyncio.Semaphore with a synchronous fast
path): never more holders than slots, waiting tasks served first come first served, and
a task cancelled while it waits (even as a slot is handed to it) takes none and loses
none."""
from __future__ import annotations

import asyncio
import random
from typing import List

from emqfast.worker.async_slots import AsyncSlots


async def _hold(slots: AsyncSlots, held: List[int], most: List[int], order: List[int],
                i: int, seconds: float) -> None:
    if not slots.take_now():
        await slots.take()
    try:
        order.append(i)
        held[0] += 1
        most[0] = max(most[0], held[0])
        await asyncio.sleep(seconds)
    finally:
        held[0] -= 1
        slots.give()


def test_never_more_holders_than_slots_and_waiters_served_in_order():
    async def main() -> None:
        slots = AsyncSlots(3)
        held, most, order = [0], [0], []
        tasks = [asyncio.ensure_future(_hold(slots, held, most, order, i, 0.002))
                 for i in range(40)]
        await asyncio.gather(*tasks)
        assert most[0] == 3 and held[0] == 0
        assert order == list(range(40))  # first come, first served
        assert slots.free == 3
    asyncio.run(main())


def test_a_waiter_cancelled_at_any_moment_takes_no_slot_and_loses_none():
    async def main() -> None:
        rng = random.Random(7)
        for _ in range(200):
            slots = AsyncSlots(2)
            held, most, order = [0], [0], []
            tasks = [asyncio.ensure_future(_hold(slots, held, most, order, i,
                                                 rng.choice([0, 0.0005])))
                     for i in range(8)]
            for _ in range(rng.randrange(4)):
                await asyncio.sleep(0)
            for task in rng.sample(tasks, 3):  # some while waiting, some while holding
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert most[0] <= 2 and held[0] == 0
            assert slots.free == 2, "a cancelled waiter kept or lost a slot"
    asyncio.run(main())


def test_a_slot_handed_to_a_waiter_as_it_is_cancelled_passes_on():
    async def main() -> None:
        slots = AsyncSlots(1)
        assert slots.take_now()
        first = asyncio.ensure_future(slots.take())
        second = asyncio.ensure_future(slots.take())
        await asyncio.sleep(0)  # both wait
        slots.give()            # the slot is handed to `first`...
        first.cancel()          # ...which is cancelled before it runs again
        await asyncio.gather(first, return_exceptions=True)
        await asyncio.wait_for(second, 1)  # so `second` got it
        assert slots.free == 0 and not slots.take_now()
        slots.give()
        assert slots.free == 1
    asyncio.run(main())
