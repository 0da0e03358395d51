"""Drive many read operations side by side, one pipeline per round.

The facade's reads are sans-IO generators (:mod:`emqfast.core.ops`): ``Queue.counts.op(q)``
yields a :class:`~emqfast.core.ops.Batch` and waits for its replies. Driving one queue's
read at a time costs a round trip per queue, 1,000 of them for the overview of 1,000
queues. :func:`run_many` steps every operation together instead: each round gathers what
all of them ask for (plain commands and batches of commands) into one pipeline, then
hands each its replies. The result is what each operation returns, or the typed error
it raised, so one broken queue does not blank the page.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from emqfast.backends.drive import typed_failure
from emqfast.core.ops import Batch, Cmd, Op

_PENDING = object()  # an operation still running


def run_many(client: Any, ops: Sequence[Op]) -> List[Any]:
    """Run ``ops`` (reads yielding :class:`Cmd` or a :class:`Batch` of them) to the end,
    each round's requests in one pipeline; returns each result or its exception."""
    results: List[Any] = [_PENDING] * len(ops)
    waiting: Dict[int, Any] = {}
    for i, op in enumerate(ops):
        _advance(i, op, ("send", None), waiting, results)
    while waiting:
        plan, commands = _plan(waiting)
        replies = _execute(client, commands)
        waiting = {}
        for i, single, start, n in plan:
            part = replies[start:start + n]
            failure = next((r for r in part if isinstance(r, Exception)), None)
            step = ("throw", typed_failure(failure)) if failure is not None else \
                ("send", part[0] if single else list(part))
            _advance(i, ops[i], step, waiting, results)
    return results


def _plan(waiting: Dict[int, Any]) -> Tuple[List[Tuple[int, bool, int, int]], List[Cmd]]:
    """(op index, single command?, first reply, reply count) per waiting op, and the
    commands of the round in order."""
    plan, commands = [], []
    for i, request in waiting.items():
        cmds = [request] if isinstance(request, Cmd) else list(request.items)
        plan.append((i, isinstance(request, Cmd), len(commands), len(cmds)))
        commands.extend(cmds)
    return plan, commands


def _execute(client: Any, commands: List[Cmd]) -> List[Any]:
    if not commands:
        return []
    pipe = client.pipeline(transaction=False)
    for c in commands:
        pipe.execute_command(*c.args, **c.options)
    try:
        return pipe.execute(raise_on_error=False)
    except Exception as exc:  # the connection itself failed: every op gets the error
        return [exc] * len(commands)


def _advance(i: int, op: Op, step: Tuple[str, Any], waiting: Dict[int, Any],
             results: List[Any]) -> None:
    """Send a reply (or throw an error) into op ``i`` and note what it asks next."""
    kind, value = step
    try:
        request = op.send(value) if kind == "send" else op.throw(value)
    except StopIteration as done:
        results[i] = done.value
        return
    except Exception as exc:  # noqa: BLE001 - kept as this op's result
        results[i] = exc
        return
    if isinstance(request, Cmd) or (isinstance(request, Batch) and all(
            isinstance(c, Cmd) for c in request.items)):
        waiting[i] = request
        return
    op.close()
    results[i] = TypeError(f"run_many drives plain reads only, not {type(request).__name__}")
