"""``emqfast workers [QUEUE...]``: the live workers, as their heartbeats describe them,
with a process Worker's handler processes (pid, jobs run, RSS, the jobs they hold) and
its child events (restarts, crashes, kills by reason, recycles)."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

import click

from emqfast.facade.metrics import physical_keys
from emqfast.facade.workers import ChildInfo, WorkerInfo, live_workers_op
from emqfast.backends.drive import run
from emqfast.tools.cli_queues import discover_queues
from emqfast.tools.cli_state import console, current_state, existing_queue, url_option
from emqfast.tools.render import fmt_size, fmt_span, json_text, styled, visible


def live_workers(conn: object, names: List[str]) -> List[WorkerInfo]:
    """The live workers of ``names``, each once (a worker of several queues beats in each),
    freshest beat first."""
    seen: Dict[str, WorkerInfo] = {}
    for name in names:
        for keys in physical_keys(conn, name):  # a partitioned queue: each partition
            for info in run(conn, live_workers_op(keys)):
                if info.token not in seen or info.age_ms < seen[info.token].age_ms:
                    seen[info.token] = info
    return sorted(seen.values(), key=lambda w: (w.age_ms, w.token))


def _num(value: object) -> str:
    return "?" if value is None else str(value)


def worker_lines(w: WorkerInfo) -> List[Tuple[str, ...]]:
    """The lines showing one worker: the first says who and what it is, the next its
    host and load, then one per handler process (job ids on lines of their own, never
    cut) and its child events. Every stored string is shown :func:`visible`."""
    kind = visible(w.kind or "?")
    slots = f"{kind}, concurrency {_num(w.concurrency)}"
    if w.children or w.kind == "process":
        slots = f"{kind}, {len(w.children)} × {_per_child(w)}"
    lines: List[Tuple[str, ...]] = [(visible(w.token), f" ({slots})")]
    lines.append((f"  host {visible(w.host)}, pid {_num(w.pid)}, queues "
                   f"{visible(', '.join(w.queues))}, in hand {_num(w.in_hand)}, "
                   f"beat {fmt_span(w.age_ms)} ago",))
    for child in w.children:
        lines.extend(child_lines(child))
    if w.kind == "process":
        events = ", ".join(f"{visible(k)} {n}" for k, n in sorted(w.child_events.items()))
        lines.append((f"  child events: {events or 'none'}",))
    return lines


def _per_child(w: WorkerInfo) -> str:
    """``concurrency 2`` per handler process (the record holds the total)."""
    if w.concurrency is None or not w.children:
        return "concurrency ?"
    return f"concurrency {max(1, w.concurrency // len(w.children))}"


def child_lines(child: ChildInfo) -> List[Tuple[str, ...]]:
    """``child 4242: 12 jobs run, RSS 41.3 MB, idle``, or ``in hand 2:`` and the ids."""
    rss = "?" if child.rss_kb is None else fmt_size(child.rss_kb * 1024)
    head = f"  child {_num(child.pid)}: {_num(child.jobs)} jobs run, RSS {rss}, "
    if not child.held:
        return [(head + "idle",)]
    out: List[Tuple[str, ...]] = [(head + f"in hand {child.held}:",)]
    out.extend((f"    {visible(job_id)}",) for job_id in child.running)
    if child.held > len(child.running):
        out.append((f"    (+{child.held - len(child.running)} more)",))
    return out


@click.command(short_help="Live workers, with a process worker's children.")
@url_option
@click.argument("queues", nargs=-1)
@click.option("--json", "as_json", is_flag=True,
              help="One JSON list of the workers, as their heartbeats say.")
def workers(queues: Tuple[str, ...], as_json: bool) -> None:
    """The live workers of QUEUES (every queue when none is named), as each one's
    heartbeat says (written about every second): a process worker also shows its
    handler processes (pid, jobs run, RSS, the jobs each holds) and its child events
    (restarts, crash, kill:timeout, kill:cancel, kill:shutdown, recycled:jobs,
    recycled:memory)."""
    state = current_state()
    for name in queues:
        existing_queue(name)  # a mistyped name is said, not shown as no workers
    names = list(queues) or discover_queues(state.conn())
    found = live_workers(state.conn(), names)
    if as_json:
        click.echo(json_text([dataclasses.asdict(w) for w in found]))
        return
    console.print(styled(("Workers", "bold"), f" on {state.where()}: {len(found)} live"),
                  soft_wrap=True, highlight=False)
    for w in found:
        for parts in worker_lines(w):
            console.print(styled((parts[0], "bold") if len(parts) > 1 else parts[0],
                                 *parts[1:]), soft_wrap=True, highlight=False)
