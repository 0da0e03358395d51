"""``emqfast demo``: the Portal LMS notifications scenario, played by real workers.

Five readings of the sorted set, on one queue (``portal-notifications``):

1. the lesson reminder — a one-shot delayed job (``enqueue_in``);
2. the weekly digest — a cron schedule upserted at every "boot" (one registry
   entry however many boots), plus a compressed-time cadence that really fires;
3. the password-reset email — priority 0, overtaking a backlog of bulk mail;
4. the failed send — a transient failure retried with exponential backoff + jitter;
5. the ranking — the digest carries the top learners of a :class:`Leaderboard`;
6. the certificate — waits (``waiting_deps``) for every lesson's grading job
   (``depends_on``), and the portal waits for it with ``ref.wait()``;
7. the nudge — "come back to your course", debounced while the learner is active
   (``dedupe="replace"``): sent once, after the activity stops.

Time is compressed (a scenario "day" lasts :data:`DAY_MS`) and every time shown
is the Redis server's clock. :func:`run_demo` returns True only when every
expectation held; the CLI turns that into the exit code.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn
from rich.text import Text

from emqfast.core.errors import Unrecoverable
from emqfast.facade.job import Job
from emqfast.facade.leaderboard import Leaderboard
from emqfast.facade.queue import Queue
from emqfast.tools import demo_flows as flows, demo_report as report
from emqfast.tools.demo_plan import (  # noqa: F401 - the scenario's names stay readable here
    BOARD, BOOTS, BULK_MAILS, BULK_PRIORITY, DAY_MS, DEADLINE_S, DIGEST_EVERY_MS, DIGEST_TZ,
    LEARNERS, LESSON_DONE, LESSONS, QUEUE, RESET_PRIORITY, SEND_BACKOFF, SEND_FAILURES,
    SEND_PRIORITY, TOP_N, WEEKLY_CRON, Check, Run, ScheduleFacts, Scenario, Timeline, band,
    retry_delays)
from emqfast.tools.render import fmt_delta
from emqfast.worker.threads import Worker


class TransientSendError(Exception):
    """The mail provider's "421 try again later"."""


class PortalHandler:
    """The one handler the worker runs: dispatches on ``payload["kind"]``."""

    def __init__(self, queue: Queue, board: Leaderboard, timeline: Timeline):
        self.queue, self.board, self.timeline = queue, board, timeline

    def __call__(self, job: Job) -> Any:
        payload = job.payload if isinstance(job.payload, dict) else {}
        kind = payload.get("kind", "unknown")
        run = self.timeline.start(kind, job, self.queue.server_time_ms())
        stored = self.queue.get(job.id)
        run.due_ms = stored.run_at_ms if stored else None
        try:
            result = getattr(self, "_" + kind.replace("-", "_"))(job, payload)
        except BaseException as exc:
            run.outcome, run.detail = "failed", f"{type(exc).__name__}: {exc}"
            run.ended_ms = self.queue.server_time_ms()
            raise
        run.outcome, run.ended_ms = "completed", self.queue.server_time_ms()
        run.result, run.detail = result, _summary(result)
        return result

    def _unknown(self, job: Job, payload: Dict[str, Any]) -> None:
        raise Unrecoverable(f"unknown job kind in {payload!r}")

    def _reminder(self, job: Job, payload: Dict[str, Any]) -> Dict[str, Any]:
        return {"to": payload["learner"], "lesson": payload["lesson"]}

    def _bulk(self, job: Job, payload: Dict[str, Any]) -> Dict[str, Any]:
        time.sleep(0.015)  # stands in for handing the mail to the provider
        return {"to": payload["to"]}

    def _reset(self, job: Job, payload: Dict[str, Any]) -> Dict[str, Any]:
        return {"to": payload["learner"], "link": "https://portal.example/reset/…"}

    def _send(self, job: Job, payload: Dict[str, Any]) -> Dict[str, Any]:
        if job.attempts <= SEND_FAILURES:
            raise TransientSendError("421 provider busy, try later")
        return {"to": payload["learner"], "delivered_on_attempt": job.attempts}

    def _digest(self, job: Job, payload: Dict[str, Any]) -> Dict[str, Any]:
        top = self.board.top(int(payload.get("top_n", TOP_N)))
        return {"course": payload.get("course"), "top": [[e.member, e.score] for e in top]}

    def _grade(self, job: Job, payload: Dict[str, Any]) -> Dict[str, Any]:
        return {"lesson": payload["lesson"], "score": LESSONS[payload["lesson"]]}

    def _certificate(self, job: Job, payload: Dict[str, Any]) -> Dict[str, Any]:
        # every grading job completed: their results, by job id (depends_on)
        grades = {g["lesson"]: g["score"] for g in job.dependency_results().values()}
        return {"to": payload["learner"], "grades": grades,
                "average": round(sum(grades.values()) / max(len(grades), 1), 1)}

    def _nudge(self, job: Job, payload: Dict[str, Any]) -> Dict[str, Any]:
        return {"to": payload["learner"], "after_activity": payload["activity"]}


def _summary(result: Any) -> str:
    """One line for the report about what a handler returned."""
    if isinstance(result, dict) and "top" in result:
        return "top: " + ", ".join(f"{m} {s:g} %" for m, s in result["top"])
    if isinstance(result, dict) and "average" in result:
        return f"to {result['to']}: average {result['average']:g} over {len(result['grades'])}"
    if isinstance(result, dict) and "score" in result:
        return f"{result['lesson']}: {result['score']}"
    if isinstance(result, dict) and "to" in result:
        return f"to {result['to']}"
    return ""


# --- the schedules part (emqfast.facade.schedules) ------------------------------------------
def boot_schedules(q: Queue, boots: int = BOOTS) -> ScheduleFacts:
    """Register the digest schedules the way a service does at every boot."""
    try:
        schedules = q.schedules
    except ImportError as exc:
        return ScheduleFacts(False, f"emqfast.facade.schedules is not available ({exc})")
    facts = ScheduleFacts(True)
    digest = {"kind": "digest", "course": "LSN-42 · Redis patterns", "top_n": TOP_N}
    for _ in range(boots):
        schedules.upsert("weekly-digest", cron=WEEKLY_CRON, tz=DIGEST_TZ, payload=digest)
        schedules.upsert("digest-demo-cadence", every_ms=DIGEST_EVERY_MS, payload=digest)
        names = [s.name for s in schedules.list()]
        facts.after_boot.append((len(names), names.count("weekly-digest")))
    facts.listed = [{"name": s.name, "cron": s.cron, "every_ms": s.every_ms, "tz": s.tz,
                     "next_ms": s.next_run_ms} for s in schedules.list()]
    return facts


def stop_demo_cadence(q: Queue) -> None:
    """Remove the compressed cadence so the queue does not mint a digest every 2 s forever."""
    try:
        q.schedules.remove("digest-demo-cadence")
    except ImportError:
        pass


# --- the scenario -----------------------------------------------------------------------
def setup(conn: Any) -> Scenario:
    """Clear the demo's queue and board, boot the schedules, seed the board, enqueue the jobs."""
    q = Queue(QUEUE, conn, attempts=1)
    board = Leaderboard(q.redis, BOARD)
    q.obliterate()  # repeated runs start from nothing
    board.clear()
    t0 = q.server_time_ms()
    facts = boot_schedules(q)
    board.set_many(LEARNERS)
    board.incr(*LESSON_DONE)
    sc = Scenario(q, board, Timeline(), t0, facts)
    sc.reminder_id = q.enqueue_in({"kind": "reminder", "learner": "USR-ada",
                                   "lesson": "LSN-7 · Sorted sets"}, DAY_MS).id
    sc.bulk_ids = [r.id for r in q.enqueue_many(
        [{"kind": "bulk", "to": f"learner{i:02d}@portal.example"} for i in range(BULK_MAILS)],
        priority=BULK_PRIORITY)]
    sc.send_id = q.enqueue({"kind": "send", "learner": "USR-grace"}, priority=SEND_PRIORITY,
                           attempts=SEND_FAILURES + 2, backoff=SEND_BACKOFF).id
    sc.reset_id = q.enqueue({"kind": "reset", "learner": "USR-linus"},
                            priority=RESET_PRIORITY).id
    flows.enqueue_certificate(sc)
    return sc


def _progress_parts(sc: Scenario) -> List[Tuple[str, int, Callable[[], int]]]:
    """(label, total, how far) for each part of the progress display."""
    q, tl = sc.queue, sc.timeline

    def reminder() -> int:
        if any(r.outcome == "completed" for r in tl.of("reminder")):
            return DAY_MS
        return min(max(q.server_time_ms() - sc.t0_ms, 0), DAY_MS - 1)

    def backlog() -> int:
        return sum(r.outcome == "completed" for r in tl.of("reset") + tl.of("bulk"))

    def send() -> int:
        return len(tl.of("send")) if not _send_done(tl) else SEND_FAILURES + 1

    def digest() -> int:
        return 1 if any(r.outcome == "completed" for r in tl.of("digest")) else 0

    def certificate() -> int:
        return 1 if sc.cert_waited.woke_ms is not None else 0

    def nudge() -> int:
        return 1 if any(r.outcome == "completed" for r in tl.of("nudge")) else 0

    return [
        (f"1 reminder: delayed one day (= {fmt_delta(DAY_MS)})", DAY_MS, reminder),
        (f"2 weekly digest: schedule, demo cadence {fmt_delta(DIGEST_EVERY_MS)}", 1, digest),
        (f"3 reset email vs {BULK_MAILS} bulk mails", BULK_MAILS + 1, backlog),
        ("4 failed send: retried with backoff", SEND_FAILURES + 1, send),
        ("5 digest carries the leaderboard's top learners", 1, digest),
        (f"6 certificate: waits for {len(LESSONS)} gradings, then ref.wait wakes", 1,
         certificate),
        ("7 nudge: debounced while the learner is active", 1, nudge),
    ]


def _send_done(tl: Timeline) -> bool:
    return any(r.outcome == "completed" for r in tl.of("send"))


def play(sc: Scenario, console: Console, show_progress: bool = True) -> None:
    """Run one worker on the queue until every part has happened (or the deadline)."""
    # the Worker mints due schedule occurrences itself (and wakes for the next run)
    worker = Worker(sc.queue, PortalHandler(sc.queue, sc.board, sc.timeline), concurrency=1,
                    lease_ms=2_000, name="portal-demo-worker")
    thread = threading.Thread(target=worker.run, name="emq-demo-worker", daemon=True)
    helpers = [threading.Thread(target=f, args=(sc,), daemon=True)
               for f in (flows.wait_for_certificate, flows.learner_active)]
    parts = _progress_parts(sc)
    started = time.monotonic()
    thread.start()
    for helper in helpers:
        helper.start()
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.percentage:>3.0f}%"), console=console,
                      disable=not show_progress, transient=False) as progress:
            tasks = [progress.add_task(label, total=total) for label, total, _ in parts]
            while True:
                done = True
                for task, (_, total, how_far) in zip(tasks, parts):
                    value = how_far()
                    progress.update(task, completed=value)
                    done = done and value >= total
                if done:
                    break
                if time.monotonic() - started > DEADLINE_S:
                    sc.timed_out = True
                    break
                time.sleep(0.05)  # the display's refresh cadence
    finally:
        worker.stop()
        thread.join(15)
        for helper in helpers:
            helper.join(15)
        stop_demo_cadence(sc.queue)
    sc.elapsed_s = time.monotonic() - started
    cert = [sc.cert_ref.id] if sc.cert_ref else []
    for job_id in [sc.reminder_id, sc.reset_id, sc.send_id, *sc.bulk_ids, *sc.grade_ids,
                   *cert, *{p.job_id for p in sc.pings}]:
        job = sc.queue.get(job_id)
        if job is not None:
            sc.jobs[job_id] = job


# --- expectations -------------------------------------------------------------------------
def checks(sc: Scenario) -> List[Check]:
    """Every expectation of the scenario, evaluated on what Redis and the worker recorded."""
    out: List[Check] = []
    tl = sc.timeline

    rem = sc.jobs.get(sc.reminder_id)
    rem_runs = tl.of("reminder")
    waited = (rem_runs[0].started_ms - rem.created_ms) if rem and rem_runs and rem.created_ms \
        else None
    out.append(Check("the reminder ran once, no earlier than its delay",
                     bool(rem and rem.state == "completed" and len(rem_runs) == 1
                          and waited is not None and waited >= DAY_MS),
                     f"enqueued → ran: {waited if waited is not None else '?'} ms "
                     f"(delay {DAY_MS} ms)"))

    sf = sc.schedules
    one_entry = sf.available and len(sf.after_boot) == BOOTS and \
        all(w == 1 for _, w in sf.after_boot) and len({n for n, _ in sf.after_boot}) == 1
    out.append(Check(f"the digest schedule stayed one entry after {BOOTS} boots", one_entry,
                     sf.error or "'weekly-digest' entries after each boot: "
                     + ", ".join(str(w) for _, w in sf.after_boot) + "; registry size: "
                     + ", ".join(str(n) for n, _ in sf.after_boot)))

    order = [r.kind for r in tl.runs if r.kind in ("reset", "bulk")]
    bulk_done = sum(1 for j in sc.bulk_ids if sc.jobs.get(j) and sc.jobs[j].state == "completed")
    out.append(Check("the reset email overtook the backlog of bulk mail",
                     bool(order) and order[0] == "reset" and order.count("reset") == 1
                     and bulk_done == BULK_MAILS,
                     f"enqueued after {BULK_MAILS} bulk mails, ran "
                     f"#{order.index('reset') + 1 if 'reset' in order else '?'} of {len(order)}; "
                     f"{bulk_done}/{BULK_MAILS} bulk mails delivered"))

    send = sc.jobs.get(sc.send_id)
    delays = [d for _, d, _ in retry_delays(sc) if d is not None]
    growing = len(delays) == SEND_FAILURES and all(a < b for a, b in zip(delays, delays[1:]))
    in_band = all(d >= band(i)[0] for i, d in enumerate(delays, start=1))
    on_time = all(r.due_ms is not None and r.started_ms >= r.due_ms for r in tl.of("send")[1:])
    out.append(Check("the failed send succeeded on a later attempt, with growing delays",
                     bool(send and send.state == "completed" and send.attempts > 1
                          and growing and in_band and on_time),
                     f"attempts {send.attempts if send else '?'}; delays "
                     + " < ".join(fmt_delta(d) for d in delays)))

    digests = [r for r in tl.of("digest") if r.outcome == "completed"]
    board_top = [[e.member, e.score] for e in sc.board.top(TOP_N)]
    carried = [r.result for r in digests]
    out.append(Check("the digest carried the leaderboard's top learners",
                     bool(digests) and all(c is not None and c.get("top") == board_top
                                           for c in carried),
                     f"{len(digests)} digest(s) ran; top {TOP_N}: "
                     + ", ".join(f"{m} {s:g} %" for m, s in board_top)))

    out += flows.checks(sc)
    out.append(Check("finished in time", not sc.timed_out and sc.elapsed_s < 15,
                     f"{sc.elapsed_s:.1f} s of real time"))
    return out


def run_demo(conn: Any, console: Optional[Console] = None, quiet: bool = False,
             where: str = "") -> bool:
    """Play the scenario and print the report; True when every expectation held."""
    import emqfast

    # emqfast.backend is a module callable at run time (select._CallableModule)
    backend_name = cast(Callable[[], str], emqfast.backend)
    console = console or Console()
    console.print(Panel.fit(
        Text.assemble(("Portal LMS notifications on emqfast\n", "bold"),
                      f"Redis: {where or 'given connection'} · backend: {backend_name()} · "
                      f"queue {QUEUE!r}\n",
                      ("Time is compressed: one scenario day lasts "
                       f"{fmt_delta(DAY_MS)}, the weekly digest also runs every "
                       f"{fmt_delta(DIGEST_EVERY_MS)}. All times are the Redis server's clock.",
                       "italic"))))
    sc = setup(conn)
    play(sc, console, show_progress=not quiet)
    results = checks(sc)
    if not quiet:
        for part in report.sections(sc):
            console.print()
            console.print(part)
    console.print()
    console.print(report.checklist(results))
    ok = all(c.ok for c in results)
    console.print(Text("All expectations held." if ok else "Some expectations did not hold.",
                       style="bold green" if ok else "bold red"))
    console.print(Text(f"Look around: emqfast stats {QUEUE} · emqfast jobs {QUEUE} · "
                       f"emqfast schedules {QUEUE}", style="dim"))
    return ok
