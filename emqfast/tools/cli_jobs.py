"""``emqfast jobs``, ``emqfast retry`` and ``emqfast cancel``: one queue's jobs."""
from __future__ import annotations

import sys
from typing import List, Optional

import click

from emqfast.facade.job import STATES, Job
from emqfast.facade.queue import Queue
from emqfast.tools.cli_state import console, current_state, err_console, url_option
from emqfast.tools.render import fmt_ms, job_detail_table, job_dict, jobs_table


def load_jobs(q: Queue, ids: List[str]) -> List[Job]:
    """Jobs by id in one pipelined round trip (ids trimmed meanwhile are skipped)."""
    pipe = q.redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hgetall(q.keys.job(job_id))
        pipe.zscore(q.keys.delayed, job_id)  # a waiting job's state is the set holding it
    got = pipe.execute()
    return [Job.from_hash(q.name, job_id, h, delayed)
            for job_id, h, delayed in zip(ids, got[::2], got[1::2]) if h]


@click.command()
@url_option
@click.argument("queue")
@click.argument("job_id", required=False)
@click.option("--state", "states", multiple=True, type=click.Choice(STATES),
              help="Only jobs in this state (repeatable). Default: every state.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1),
              help="At most this many jobs per state.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def jobs(queue: str, job_id: Optional[str], states: tuple, limit: int, as_json: bool) -> None:
    """List the jobs of QUEUE, or inspect JOB_ID in detail."""
    import json

    q = current_state().queue(queue)
    now = q.server_time_ms()
    if job_id:
        job = q.get(job_id)
        if job is None:
            err_console.print(f"[red]no job {job_id} in {queue}[/red]")
            sys.exit(1)
        if as_json:
            click.echo(json.dumps(job_dict(job), ensure_ascii=False))
        else:
            console.print(job_detail_table(job, now))
        return
    found: List[Job] = []
    for st in states or STATES:
        found += load_jobs(q, q.job_ids(st, 0, limit - 1))
    if as_json:
        click.echo(json.dumps([job_dict(j) for j in found], ensure_ascii=False))
        return
    which = ", ".join(states) if states else "all states"
    console.print(jobs_table(found, now, title=f"{queue}: {which} (server clock {fmt_ms(now)})"))
    if not found:
        console.print("[dim]no jobs[/dim]")


@click.command()
@url_option
@click.argument("queue")
@click.argument("job_id")
def retry(queue: str, job_id: str) -> None:
    """Send failed JOB_ID back to pending with a fresh set of attempts."""
    current_state().queue(queue).retry(job_id)
    console.print(f"[green]retrying[/green] {job_id} (pending again in {queue})")


@click.command()
@url_option
@click.argument("queue")
@click.argument("job_id")
def cancel(queue: str, job_id: str) -> None:
    """Remove JOB_ID if it has not started (scheduled or pending)."""
    if current_state().queue(queue).cancel(job_id):
        console.print(f"[green]cancelled[/green] {job_id}")
        return
    err_console.print(f"[red]cannot cancel {job_id}[/red]: unknown, running or already finished")
    sys.exit(1)
