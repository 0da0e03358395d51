"""``emqfast jobs``, ``emqfast enqueue``, ``emqfast retry`` and ``emqfast cancel``: one
queue's jobs."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple, cast

import click

from emqfast.core.errors import JobNotFound, JobStateError
from emqfast.core.validation import check_job_id
from emqfast.facade.job import STATES, Job
from emqfast.facade.partitioned import PartitionedQueue
from emqfast.facade.queue import Queue
from emqfast.tools.cli_state import (console, current_state, err_console, existing_queue, fail,
                                     print_unbounded, url_option)
from emqfast.tools.render import (LONG_FIELDS, field_text, fmt_ms, job_detail_table,
                                  job_dict, jobs_table, json_text, plain, styled, visible)


def physical_queues(q: Queue) -> List[Queue]:
    """The queues holding ``q``'s jobs: a partitioned queue's partitions, else ``q``."""
    return list(q.partition_queues) if isinstance(q, PartitionedQueue) else [q]


def load_jobs(q: Queue, ids: List[str]) -> List[Job]:
    """Jobs by id in one pipelined round trip (ids trimmed meanwhile are skipped)."""
    pipe = q.redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hgetall(q.keys.job(job_id))
        pipe.zscore(q.keys.delayed, job_id)  # a waiting job's state is the set holding it
        pipe.zscore(q.keys.active, job_id)
    got = pipe.execute()
    return [Job.from_hash(q.name, job_id, h, delayed, active)
            for job_id, h, delayed, active in zip(ids, got[::3], got[1::3], got[2::3]) if h]


@click.command()
@url_option
@click.argument("queue")
@click.argument("job_id", required=False)
@click.option("--state", "states", multiple=True, type=click.Choice(STATES), metavar="STATE",
              help=f"Only jobs in this state (repeatable): {', '.join(STATES)}. "
                   "Default: every state.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1),
              help="At most this many jobs per state.")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable output (always every field, uncut).")
@click.option("--output", "-o", type=click.Choice(["table", "wide"]), default="table",
              show_default=True, metavar="FORMAT",
              help="table or wide. The table fits the terminal (never cutting an id); "
                   "wide shows every column, times with their dates, whatever its width.")
@click.option("--full", is_flag=True,
              help="With JOB_ID: print the whole payload, result and traceback after the "
                   "table (the table shows the first 2,000 characters of each).")
def jobs(queue: str, job_id: Optional[str], states: Tuple[str, ...], limit: int, as_json: bool,
         output: str, full: bool) -> None:
    """List the jobs of QUEUE, or inspect JOB_ID in detail."""
    q = existing_queue(queue)
    now = q.server_time_ms()
    if job_id:
        job, size = _job_or_exit(q, job_id)
        if as_json:
            click.echo(json_text(job_dict(job)))
            return
        console.print(job_detail_table(job, now, size))
        if full:
            _dump_long_fields(job)
        return
    found: List[Job] = []
    for st in states or STATES:
        of_state: List[Job] = []
        for part in physical_queues(q):  # a partitioned queue: partition after partition
            of_state += load_jobs(part, part.job_ids(st, 0, limit - 1))
        found += of_state[:limit]
    if as_json:
        click.echo(json_text([job_dict(j) for j in found]))
        return
    which = ", ".join(states) if states else "all states"
    # the title on a line of its own: a table's title wraps at the table's width
    console.print(plain(f"{queue}: {which} (server clock {fmt_ms(now)})"))
    if output == "wide":
        print_unbounded(jobs_table(found, now, wide=True))
    else:
        console.print(jobs_table(found, now, width=console.width))
    if not found:
        console.print(styled(("no jobs", "dim")))


def _job_or_exit(q: Queue, job_id: str) -> Tuple[Job, int]:
    """The job and its stored payload's size in bytes (read in the same round trip as
    ``q.get``), or one line saying it is not there (exit 1)."""
    check_job_id(job_id)
    if isinstance(q, PartitionedQueue):  # the partition holding it (at most P reads)
        q = q.find_partition(job_id) or q.partition(0)
    pipe = q.redis.pipeline(transaction=False)
    pipe.hgetall(q.keys.job(job_id))
    pipe.zscore(q.keys.delayed, job_id)  # a waiting job's state is the set holding it
    pipe.zscore(q.keys.active, job_id)
    h, delayed, active = pipe.execute()
    if not h:
        fail(styled((f"no job {job_id} in {q.name}", "red"), " (never enqueued, or trimmed)"))
    return Job.from_hash(q.name, job_id, h, delayed, active), len(h.get(b"payload", b""))


def _dump_long_fields(job: Job) -> None:
    """``--full``: the long fields whole, as plain text (not through rich: a 20 MB value
    takes rich minutes to lay out), each after a header line with its size."""
    data = job_dict(job)
    for name in LONG_FIELDS:
        if data[name] is None:
            continue
        text = field_text(data[name])
        click.echo(f"--- {name} ({len(text):,} characters) ---")
        click.echo(visible(text, lines=True))


RETRY_BATCH = 500  # ids read per round trip by ``retry --all``


@click.command()
@url_option
@click.argument("queue")
@click.argument("payload", metavar="JSON")
@click.option("--delay-ms", type=click.IntRange(0), default=None, metavar="N",
              help="Run it N milliseconds from now (scheduled until then).")
@click.option("--priority", type=click.IntRange(0), default=0, show_default=True, metavar="P",
              help="Lower runs first.")
@click.option("--job-id", default=None, metavar="ID",
              help="Its id (must start with JOB); an existing id writes nothing.")
def enqueue(queue: str, payload: str, delay_ms: Optional[int], priority: int,
            job_id: Optional[str]) -> None:
    """Add one job to QUEUE with the JSON payload; print its id."""
    import json

    try:
        data: Any = json.loads(payload)
    except ValueError as exc:
        fail(styled(("invalid JSON payload", "red"), f": {exc}"))
    ref = current_state().queue(queue).enqueue(data, job_id=job_id, priority=priority,
                                               delay_ms=delay_ms)
    click.echo(visible(ref.id))
    if ref.status == "duplicate":
        err_console.print(styled(f"{ref.id} already exists in {queue}: nothing written"))


@click.command(short_help="Send failed jobs back to pending with fresh attempts.")
@url_option
@click.argument("queue")
@click.argument("job_id", required=False)
@click.option("--all", "every", is_flag=True, help="Retry every job in --state.")
@click.option("--state", default="failed", show_default=True, type=click.Choice(["failed"]),
              help="With --all: the state whose jobs are retried.")
def retry(queue: str, job_id: Optional[str], every: bool, state: str) -> None:
    """Send failed JOB_ID (or, with --all, every failed job) back to pending with a
    fresh set of attempts."""
    if bool(job_id) == every:
        fail(styled(("retry needs a JOB_ID or --all", "red"), " (not both)"), code=2)
    q = existing_queue(queue)
    if every:
        retried, skipped = retry_every(q, state)
        note = f"; {skipped} skipped (changed meanwhile)" if skipped else ""
        console.print(styled((f"retried {retried}", "green"), f" {state} jobs in {queue}{note}"))
        return
    # job_id is given (checked above); a refusal names the job's state (JobStateError)
    # or JobNotFound
    q.retry(cast(str, job_id))
    console.print(styled(("retrying", "green"), f" {job_id} (pending again in {queue})"))


def retry_every(q: Queue, state: str = "failed", batch: int = RETRY_BATCH) -> Tuple[int, int]:
    """Retry the jobs in ``state`` a batch of ids at a time; ``(retried, skipped)``.

    Bounded by the count at the start, so jobs failing meanwhile do not keep it going.
    A job another client moved meanwhile is skipped; one whose data is gone stays in the
    set, so the next read starts after those (``stuck``)."""
    budget = q.counts()[state]
    retried = skipped = stuck = 0
    while retried + skipped < budget:
        room = min(batch, budget - retried - skipped)
        ids = q.job_ids(state, stuck, stuck + room - 1)
        if not ids:
            break
        for one in ids:
            try:
                q.retry(one)
                retried += 1
            except JobStateError:  # no longer failed: it left the set
                skipped += 1
            except JobNotFound:  # listed but its data is gone: it stays in the set
                skipped += 1
                stuck += 1
    return retried, skipped


@click.command(short_help="Cancel a job (a running one: its worker stops it).")
@url_option
@click.argument("queue")
@click.argument("job_id")
def cancel(queue: str, job_id: str) -> None:
    """Cancel JOB_ID: at once if it waits (scheduled, pending or waiting for its
    dependencies); a running one's worker is asked to stop it, and it ends cancelled."""
    q = existing_queue(queue)
    try:
        answer = q.cancel(job_id)
        if answer == "requested":  # active; its worker ends it
            console.print(styled(("cancel requested", "green"),
                                 f" {job_id}: it is running; its worker was asked to stop it "
                                 f"(it ends cancelled: 'emqfast jobs {queue} --state "
                                 "cancelled')"))
            return
        if answer:
            console.print(styled(("cancelled", "green"), f" {job_id} (its record stays: "
                                 f"'emqfast jobs {queue} --state cancelled')"))
            return
    except JobNotFound:
        fail(styled((f"cannot cancel {job_id}", "red"),
                    f": no such job in {q.name} (never enqueued there, or trimmed)"))
    fail(styled((f"cannot cancel {job_id}", "red"), f": {_why_not_cancelled(q, job_id)}"))


def _why_not_cancelled(q: Queue, job_id: str) -> str:
    job = q.get(job_id)
    if job is None:
        return f"no such job in {q.name} (trimmed meanwhile)"
    if job.state == "active":
        return "it is running"
    if job.state in ("completed", "failed"):
        return f"it already finished ({job.state})"
    if job.state == "cancelled":
        return "it is cancelled already"
    return f"it is {job.state} (changed meanwhile; try again)"
