"""``emqfast demo``: the Portal LMS notifications scenario, played by real workers.

Five readings of the sorted set, on one queue (``portal-notifications``):

1. the lesson reminder — a one-shot delayed job (``enqueue_in``);
2. the weekly digest — a cron schedule upserted at every "boot" (one registry
   entry however many boots), plus a compressed-time cadence that really fires;
3. the password-reset email — priority 0, overtaking a backlog of bulk mail;
4. the failed send — a transient failure retried with exponential backoff + jitter;
5. the ranking — the digest carries the top learners of a :class:`Leaderboard`.

Time is compressed (a scenario "day" lasts :data:`DAY_MS`) and every time shown
is the Redis server's clock. :func:`run_demo` returns True only when every
expectation held; the CLI turns that into the exit code.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple
from zoneinfo import ZoneInfo

from rich.console import Console, Group
from rich.panel import Panel
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table
from rich.text import Text

from .backoff import Backoff
from .errors import Unrecoverable
from .job import Job
from .leaderboard import Leaderboard
from .queue import Queue
from .render import fmt_delta, fmt_ms
from .worker import Worker

QUEUE = "portal-notifications"
BOARD = "portal-course-42-progress"

DAY_MS = 3_000               # one scenario day ("the lesson starts tomorrow") lasts 3 s
DIGEST_EVERY_MS = 2_000      # the weekly digest's compressed cadence, so it fires during the demo
WEEKLY_CRON, DIGEST_TZ = "0 9 * * 1", "Europe/Paris"   # Mondays 09:00, Paris time
BOOTS = 3                    # service restarts that each re-register the schedules
BULK_MAILS = 30
BULK_PRIORITY, SEND_PRIORITY, RESET_PRIORITY = 100, 50, 0
SEND_FAILURES = 3            # the mail provider refuses the first three tries
SEND_BACKOFF = Backoff.exponential(250, cap=10_000, jitter=0.2)
TOP_N = 3
DEADLINE_S = 13.0            # the demo gives up (and fails) after this

# Portal.Enrollment.Progress percent per learner (Portal.Accounts.User)
LEARNERS = {"USR-ada": 92, "USR-alan": 64, "USR-barbara": 58, "USR-grace": 87,
            "USR-linus": 87, "USR-margaret": 71}
LESSON_DONE = ("USR-alan", 25)  # alan finishes a lesson during the week: +25 %


class TransientSendError(Exception):
    """The mail provider's "421 try again later"."""


@dataclass
class Run:
    """One handler execution, as the worker saw it (server-clock times)."""

    seq: int
    kind: str
    job_id: str
    attempt: int
    started_ms: int
    due_ms: Optional[int] = None      # the job's run-at (delayed jobs and retries)
    outcome: str = "running"
    ended_ms: Optional[int] = None
    detail: str = ""
    result: Any = None


@dataclass
class Timeline:
    """Every handler execution in order; written from the worker's handler threads."""

    runs: List[Run] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, kind: str, job: Job, now_ms: int) -> Run:
        """Record the start of one execution."""
        with self.lock:
            run = Run(len(self.runs) + 1, kind, job.id, job.attempts, now_ms)
            self.runs.append(run)
            return run

    def of(self, kind: str) -> List[Run]:
        """Executions of one kind of job, in order."""
        with self.lock:
            return [r for r in self.runs if r.kind == kind]


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

    def _unknown(self, job: Job, payload: dict) -> None:
        raise Unrecoverable(f"unknown job kind in {payload!r}")

    def _reminder(self, job: Job, payload: dict) -> dict:
        return {"to": payload["learner"], "lesson": payload["lesson"]}

    def _bulk(self, job: Job, payload: dict) -> dict:
        time.sleep(0.015)  # stands in for handing the mail to the provider
        return {"to": payload["to"]}

    def _reset(self, job: Job, payload: dict) -> dict:
        return {"to": payload["learner"], "link": "https://portal.example/reset/…"}

    def _send(self, job: Job, payload: dict) -> dict:
        if job.attempts <= SEND_FAILURES:
            raise TransientSendError("421 mail provider busy, try again later")
        return {"to": payload["learner"], "delivered_on_attempt": job.attempts}

    def _digest(self, job: Job, payload: dict) -> dict:
        top = self.board.top(int(payload.get("top_n", TOP_N)))
        return {"course": payload.get("course"), "top": [[e.member, e.score] for e in top]}


def _summary(result: Any) -> str:
    if isinstance(result, dict) and "top" in result:
        return "top: " + ", ".join(f"{m} {s:g} %" for m, s in result["top"])
    return ""


# --- the schedules part (emqfast.schedules) ------------------------------------------
@dataclass
class ScheduleFacts:
    """What the boots showed: registry entries after each boot, and the listed schedules."""

    available: bool
    error: str = ""
    after_boot: List[Tuple[int, int]] = field(default_factory=list)  # (entries, weekly rows)
    listed: List[Dict[str, Any]] = field(default_factory=list)


def boot_schedules(q: Queue, boots: int = BOOTS) -> ScheduleFacts:
    """Register the digest schedules the way a service does at every boot."""
    try:
        schedules = q.schedules
    except ImportError as exc:
        return ScheduleFacts(False, f"emqfast.schedules is not available ({exc})")
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
@dataclass
class Scenario:
    """Everything the run produced, for the checks and the report."""

    queue: Queue
    board: Leaderboard
    timeline: Timeline
    t0_ms: int
    schedules: ScheduleFacts
    reminder_id: str = ""
    reset_id: str = ""
    send_id: str = ""
    bulk_ids: List[str] = field(default_factory=list)
    jobs: Dict[str, Job] = field(default_factory=dict)
    elapsed_s: float = 0.0
    timed_out: bool = False


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

    return [
        (f"1 reminder: delayed one day (= {fmt_delta(DAY_MS)})", DAY_MS, reminder),
        (f"2 weekly digest: schedule, demo cadence {fmt_delta(DIGEST_EVERY_MS)}", 1, digest),
        (f"3 reset email vs {BULK_MAILS} bulk mails", BULK_MAILS + 1, backlog),
        ("4 failed send: retried with backoff", SEND_FAILURES + 1, send),
        ("5 digest carries the leaderboard's top learners", 1, digest),
    ]


def _send_done(tl: Timeline) -> bool:
    return any(r.outcome == "completed" for r in tl.of("send"))


def play(sc: Scenario, console: Console, show_progress: bool = True) -> None:
    """Run one worker on the queue until every part has happened (or the deadline)."""
    # the Worker mints due schedule occurrences itself (and wakes for the next run)
    worker = Worker(sc.queue, PortalHandler(sc.queue, sc.board, sc.timeline), concurrency=1,
                    lease_ms=2_000, name="portal-demo-worker")
    thread = threading.Thread(target=worker.run, name="emq-demo-worker", daemon=True)
    parts = _progress_parts(sc)
    started = time.monotonic()
    thread.start()
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
        stop_demo_cadence(sc.queue)
    sc.elapsed_s = time.monotonic() - started
    for job_id in [sc.reminder_id, sc.reset_id, sc.send_id, *sc.bulk_ids]:
        job = sc.queue.get(job_id)
        if job is not None:
            sc.jobs[job_id] = job


# --- expectations -------------------------------------------------------------------------
@dataclass
class Check:
    """One expectation and whether it held."""

    label: str
    ok: bool
    detail: str


def _retry_delays(sc: Scenario) -> List[Tuple[Run, Optional[int], Optional[int]]]:
    """Per send attempt: (run, measured retry delay after it, due time of the next attempt).

    The delay is ``next due - this attempt's failure`` on the server clock: the
    worker computed it from the backoff and ``fail.lua`` parked the job until then.
    """
    runs = sc.timeline.of("send")
    out = []
    for i, run in enumerate(runs):
        nxt = runs[i + 1] if i + 1 < len(runs) else None
        due = nxt.due_ms if nxt else None
        delay = (due - run.ended_ms) if (due is not None and run.ended_ms is not None) else None
        out.append((run, delay, due))
    return out


def band(attempt: int) -> Tuple[int, int]:
    """The backoff band (without jitter's draw) for the retry after ``attempt``."""
    d = min(SEND_BACKOFF.base_ms << (attempt - 1), SEND_BACKOFF.cap_ms)
    w = int(d * SEND_BACKOFF.band)
    return d - w, d + w


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
    delays = [d for _, d, _ in _retry_delays(sc) if d is not None]
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

    out.append(Check("finished in time", not sc.timed_out and sc.elapsed_s < 15,
                     f"{sc.elapsed_s:.1f} s of real time"))
    return out


# --- the report ------------------------------------------------------------------------
def _t(sc: Scenario, ms: Optional[int]) -> str:
    """Server time of day plus offset from the start of the demo."""
    if ms is None:
        return "-"
    return f"{fmt_ms(ms, date=False)}  +{(ms - sc.t0_ms) / 1000:.3f} s"


def _label(run: Run) -> str:
    return {"reminder": "lesson reminder (LSN-7)", "bulk": "bulk mail",
            "reset": "password-reset email", "send": "digest e-mail (flaky provider)",
            "digest": "weekly digest (demo cadence)"}.get(run.kind, run.kind)


def timeline_table(sc: Scenario) -> Table:
    """What ran, in order, when (server clock); consecutive bulk mails are folded."""
    table = Table(title="What ran, in order — one worker, concurrency 1; server clock (UTC) and "
                        "time since the start", title_justify="left")
    for name, justify in (("#", "right"), ("started", "left"), ("job", "left"),
                          ("attempt", "right"), ("outcome", "left"), ("detail", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    runs = list(sc.timeline.runs)
    i = 0
    while i < len(runs):
        run = runs[i]
        if run.kind == "bulk":
            j = i
            while j + 1 < len(runs) and runs[j + 1].kind == "bulk":
                j += 1
            if j > i:
                ok = all(r.outcome == "completed" for r in runs[i:j + 1])
                table.add_row(f"{run.seq}–{runs[j].seq}", _t(sc, run.started_ms),
                              f"bulk mail ×{j - i + 1}", "1",
                              Text("completed" if ok else "mixed", "green" if ok else "yellow"),
                              f"priority {BULK_PRIORITY}")
                i = j + 1
                continue
        style = {"completed": "green", "failed": "red"}.get(run.outcome, "yellow")
        table.add_row(str(run.seq), _t(sc, run.started_ms), _label(run), str(run.attempt),
                      Text(run.outcome, style), run.detail)
        i += 1
    return table


def _heading(text: str, note: str = "") -> Text:
    out = Text(text, style="bold")
    if note:
        out.append("  " + note, style="dim")
    return out


def reminder_section(sc: Scenario) -> Group:
    """Part 1: enqueued, due and ran, on the server clock."""
    job = sc.jobs.get(sc.reminder_id)
    runs = sc.timeline.of("reminder")
    table = Table(show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("enqueued", _t(sc, job.created_ms if job else None))
    table.add_row("due (run at)", _t(sc, job.run_at_ms if job else None))
    table.add_row("ran", _t(sc, runs[0].started_ms if runs else None))
    if job and runs and job.created_ms:
        table.add_row("waited", f"{runs[0].started_ms - job.created_ms} ms "
                                f"(asked for {DAY_MS} ms)")
    return Group(_heading("1 · Lesson reminder — a one-shot delayed job",
                          f"enqueue_in(payload, {DAY_MS}): 'tomorrow' compressed to "
                          f"{fmt_delta(DAY_MS)}"), table)


def schedule_section(sc: Scenario) -> Any:
    """Part 2: registry size across boots, and the schedules with next runs in Paris time."""
    sf = sc.schedules
    if not sf.available:
        return Text(f"2 · Weekly digest — {sf.error}", style="red")
    boots = Table()
    boots.add_column("boot", justify="right")
    boots.add_column("registry entries", justify="right")
    boots.add_column("'weekly-digest' entries", justify="right")
    for i, (n, weekly) in enumerate(sf.after_boot, start=1):
        boots.add_row(str(i), str(n), str(weekly))
    listed = Table()
    for name in ("name", "cadence", "time zone", "next run (schedule's zone)"):
        listed.add_column(name)
    for s in sf.listed:
        tz = s.get("tz") or "UTC"
        cadence = f"cron {s['cron']}" if s.get("cron") else f"every {fmt_delta(s.get('every_ms'))}"
        nxt = s.get("next_ms")
        listed.add_row(s["name"], cadence, tz,
                       fmt_ms(nxt, ZoneInfo(tz)) + (f" ({_weekday(nxt, tz)})" if nxt else ""))
    note = Text(f"The weekly cron cannot fire during a demo, so the same digest also runs every "
                f"{fmt_delta(DIGEST_EVERY_MS)} (compressed time); that cadence is removed at the "
                "end.", style="dim")
    return Group(_heading("2 · Weekly digest — a cron schedule upserted at every boot",
                          f"schedules.upsert('weekly-digest', cron={WEEKLY_CRON!r}, "
                          f"tz={DIGEST_TZ!r}) on each of {BOOTS} boots"),
                 boots, Text("the registry afterwards (next runs in each schedule's zone):"),
                 listed, note)


def _weekday(ms: int, tz: str) -> str:
    import datetime as dt
    return dt.datetime.fromtimestamp(ms / 1000, ZoneInfo(tz)).strftime("%A")


def priority_section(sc: Scenario) -> Text:
    """Part 3: enqueue order vs run order."""
    order = [r for r in sc.timeline.runs if r.kind in ("reset", "bulk")]
    pos = next((i for i, r in enumerate(order, start=1) if r.kind == "reset"), None)
    bulk_first = next((r for r in order if r.kind == "bulk"), None)
    text = _heading("3 · Password reset — a priority job overtakes the backlog\n")
    text.append(f"   enqueued last, after {BULK_MAILS} bulk mails (priority {BULK_PRIORITY}), "
                f"with priority {RESET_PRIORITY} (lower runs first)\n")
    reset = next((r for r in order if r.kind == "reset"), None)
    text.append(f"   ran #{pos if pos else '?'} of {len(order)} at "
                f"{_t(sc, reset.started_ms if reset else None)}; first bulk mail at "
                f"{_t(sc, bulk_first.started_ms if bulk_first else None)}")
    return text


def retry_section(sc: Scenario) -> Group:
    """Part 4: every attempt of the flaky send with its backoff delay."""
    b = SEND_BACKOFF
    table = Table()
    for name in ("attempt", "started", "outcome", "retry delay after it", "backoff band"):
        table.add_column(name)
    for run, delay, _due in _retry_delays(sc):
        lo, hi = band(run.attempt)
        style = "green" if run.outcome == "completed" else "red"
        table.add_row(str(run.attempt), _t(sc, run.started_ms),
                      Text(run.outcome + ("" if run.outcome == "completed" else
                                          f" ({run.detail.split(': ', 1)[-1]})"), style),
                      fmt_delta(delay) if delay is not None else "-",
                      f"{lo}–{hi} ms" if run.outcome != "completed" else "-")
    return Group(_heading("4 · Failed send — retried with exponential backoff + jitter",
                          f"base {b.base_ms} ms, ×2 per attempt, ±{b.band:.0%}; the provider "
                          f"refuses the first {SEND_FAILURES} tries"), table)


def ranking_section(sc: Scenario) -> Group:
    """Part 5: the board and what the digest carried."""
    table = Table()
    table.add_column("rank", justify="right")
    table.add_column("learner")
    table.add_column("progress", justify="right")
    for e in sc.board.top(len(LEARNERS)):
        table.add_row(str(e.rank), e.member, f"{e.score:g} %",
                      style="bold" if e.rank <= TOP_N else "")
    digests = [r for r in sc.timeline.of("digest") if r.outcome == "completed"]
    carried = Text(f"   {LESSON_DONE[0]} finished a lesson: +{LESSON_DONE[1]} % (incr). ")
    if digests:
        carried.append(f"The digest at {_t(sc, digests[0].started_ms)} carried the top {TOP_N}: "
                       + ", ".join(f"{m} ({s:g} %)" for m, s in digests[0].result["top"]))
    else:
        carried.append("No digest ran.", style="red")
    return Group(_heading("5 · Ranking — the leaderboard the digest carries",
                          f"Leaderboard {BOARD!r}: progress %, ties ranked by name"),
                 table, carried)


def checklist(results: List[Check]) -> Table:
    """✓/✗ per expectation."""
    table = Table(title="Expectations", title_justify="left", show_header=False)
    table.add_column(width=2)
    table.add_column()
    table.add_column(style="dim")
    for c in results:
        table.add_row(Text("✓", "bold green") if c.ok else Text("✗", "bold red"), c.label, c.detail)
    return table


def run_demo(conn: Any, console: Optional[Console] = None, quiet: bool = False,
             where: str = "") -> bool:
    """Play the scenario and print the report; True when every expectation held."""
    import emqfast

    console = console or Console()
    console.print(Panel.fit(
        Text.assemble(("Portal LMS notifications on emqfast\n", "bold"),
                      f"Redis: {where or 'given connection'} · backend: {emqfast.backend()} · "
                      f"queue {QUEUE!r}\n",
                      ("Time is compressed: one scenario day lasts "
                       f"{fmt_delta(DAY_MS)}, the weekly digest also runs every "
                       f"{fmt_delta(DIGEST_EVERY_MS)}. All times are the Redis server's clock.",
                       "italic"))))
    sc = setup(conn)
    play(sc, console, show_progress=not quiet)
    results = checks(sc)
    if not quiet:
        for part in (timeline_table(sc), reminder_section(sc), schedule_section(sc),
                     priority_section(sc), retry_section(sc), ranking_section(sc)):
            console.print()
            console.print(part)
    console.print()
    console.print(checklist(results))
    ok = all(c.ok for c in results)
    console.print(Text("All expectations held." if ok else "Some expectations did not hold.",
                       style="bold green" if ok else "bold red"))
    console.print(Text(f"Look around: emqfast stats {QUEUE} · emqfast jobs {QUEUE} · "
                       f"emqfast schedules {QUEUE}", style="dim"))
    return ok
