"""The one way tests wait: poll a condition against a deadline, never sleep and hope.

``wait_until`` polls from a plain test or a thread; ``wait_until_async`` is its twin
for code running inside an event loop (it awaits between polls, so the loop keeps
running the worker under test). Both return the condition's first truthy value and,
when the deadline passes, fail with an AssertionError that names what was awaited,
for how long, and the last value the condition returned.

Helper scripts the tests start as processes (tests/fault_procs.py) import it too:
this module depends on nothing but the standard library.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Awaitable, Callable, Union

DEFAULT_TIMEOUT_S = 15.0
DEFAULT_INTERVAL_S = 0.005


def _timed_out(what: str, timeout: float, last: Any) -> AssertionError:
    shown = repr(last)
    if len(shown) > 200:  # a whole scraped page says nothing more than its start
        shown = shown[:200] + "..."
    return AssertionError(f"timed out after {timeout:g}s waiting for {what} "
                          f"(last value: {shown})")


def wait_until(cond: Callable[[], Any], timeout: float = DEFAULT_TIMEOUT_S,
               what: str = "condition", interval: float = DEFAULT_INTERVAL_S) -> Any:
    """Poll ``cond`` every ``interval`` s until it returns a truthy value, and return it.

    ``cond`` is always called at least once, and once more after the deadline, so a slow
    poll cannot time out a condition that holds. Fails (AssertionError naming ``what``)
    after ``timeout`` s. An exception raised by ``cond`` propagates at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, value)
        time.sleep(interval)


async def wait_until_async(cond: Callable[[], Union[Any, Awaitable[Any]]],
                           timeout: float = DEFAULT_TIMEOUT_S, what: str = "condition",
                           interval: float = DEFAULT_INTERVAL_S) -> Any:
    """:func:`wait_until` for a coroutine: ``await asyncio.sleep(interval)`` between polls.

    ``cond`` may be a plain callable or return an awaitable (``lambda: q.counts()`` on an
    asyncio Queue): an awaitable is awaited and its result tested.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, value)
        await asyncio.sleep(interval)
