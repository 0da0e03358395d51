"""What the worker machine asks of its driver, and the loops that drive it.

The worker's logic (:mod:`emqfast.worker.machine` and its parts) is written once, as
generators in the style of :mod:`emqfast.core.ops`: they ``yield`` an effect, the
driver performs it and sends the result back (or throws the typed error in). Each
effect names the driver method that performs it (``_do_<verb>``):

- the thread driver (:class:`emqfast.Worker`) performs them blocking, with locks;
- the asyncio driver (:class:`emqfast.aio.Worker`) awaits them on its event loop.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Generator, NamedTuple, Optional, Sequence, Tuple

from emqfast.core.ops import Call

# A piece of worker logic: yields effects, receives their results, returns its own.
Logic = Generator[Any, Any, Any]


class Send(NamedTuple):
    """Run one script call; its reply, or its error typed (:func:`resend.typed`)."""

    call: Call

    @property
    def method(self) -> str:  # the driver's method (a property: a NamedTuple has only fields)
        return "_do_send"


class Pipeline(NamedTuple):
    """Run script calls in one pipeline; a reply (or error reply) per call. ``acks``: the
    acker's calls (the thread driver sends them through the backend Batcher)."""

    calls: Sequence[Call]
    acks: bool = False

    @property
    def method(self) -> str:
        return "_do_pipeline"


class Sleep(NamedTuple):
    """Sleep ``seconds``; ``wake_on_stop``: a stop may end the sleep early."""

    seconds: float
    wake_on_stop: bool = False

    @property
    def method(self) -> str:
        return "_do_sleep"


class Invoke(NamedTuple):
    """Call ``fn(**kwargs)`` (a Queue method, a beat hook); the async driver awaits what
    it returns when that is awaitable."""

    fn: Callable[..., Any]
    kwargs: Dict[str, Any] = {}

    @property
    def method(self) -> str:
        return "_do_invoke"


class WaitForRoom(NamedTuple):
    """``(free handler slots, jobs the worker may claim now)``; with no slot for a held job
    and no room to claim, wait up to ``seconds`` for a running job to end first."""

    seconds: float

    @property
    def method(self) -> str:
        return "_do_wait_for_room"


class WaitDrained(NamedTuple):
    """While jobs of ours are running or being acked, wait up to ``seconds`` for one to be
    written (True); with none in flight, False at once."""

    seconds: float

    @property
    def method(self) -> str:
        return "_do_wait_drained"


class PopMarker(NamedTuple):
    """Block on the queue's wake marker up to ``seconds``: ``(member, score)`` or None."""

    seconds: float

    @property
    def method(self) -> str:
        return "_do_pop_marker"


class _Got(NamedTuple):
    ok: bool
    value: Any


_START = _Got(True, None)


def _advance(logic: Logic, got: _Got) -> Tuple[bool, Any]:
    """Hand ``got`` to the logic: ``(False, next effect)`` or ``(True, its result)``."""
    try:
        return False, (logic.send(got.value) if got.ok else logic.throw(got.value))
    except StopIteration as finished:
        return True, finished.value


def drive(logic: Logic, driver: Any) -> Any:
    """Run ``logic`` to its end, performing each effect with ``driver``'s blocking methods."""
    got = _START
    while True:
        finished, effect = _advance(logic, got)
        if finished:
            return effect
        try:
            got = _Got(True, getattr(driver, effect.method)(effect))
        except Exception as exc:  # noqa: BLE001 - thrown into the logic at its yield
            got = _Got(False, exc)


async def drive_async(logic: Logic, driver: Any) -> Any:
    """:func:`drive` for the asyncio driver: its ``_do_*`` methods are coroutines. A
    cancellation is not thrown into the logic: it ends it (closed) and propagates."""
    got: Optional[_Got] = _START
    try:
        while got is not None:
            finished, effect = _advance(logic, got)
            if finished:
                return effect
            try:
                got = _Got(True, await getattr(driver, effect.method)(effect))
            except Exception as exc:  # noqa: BLE001 - thrown into the logic at its yield
                got = _Got(False, exc)
    finally:
        logic.close()
