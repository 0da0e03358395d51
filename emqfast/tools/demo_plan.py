"""The demo's plan: the Portal LMS scenario's constants and the records its run leaves
(:class:`Run`, :class:`Timeline`, :class:`ScheduleFacts`, :class:`Scenario`,
:class:`Check`), shared by :mod:`emqfast.tools.demo` (which plays it) and
:mod:`emqfast.tools.demo_report` (which prints it); neither imports the other's module.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from emqfast.facade.options import Backoff
from emqfast.facade.job import Job, JobRef
from emqfast.facade.leaderboard import Leaderboard, Member
from emqfast.facade.queue import Queue

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
LEARNERS: Dict[Member, float] = {"USR-ada": 92, "USR-alan": 64, "USR-barbara": 58,
                                  "USR-grace": 87, "USR-linus": 87, "USR-margaret": 71}
LESSON_DONE = ("USR-alan", 25)  # alan finishes a lesson during the week: +25 %

# Part 6: ada's course certificate waits for every lesson's grading job (depends_on), and
# the portal's page waits for the certificate itself (ref.wait: woken by its end)
CERT_LEARNER = "USR-ada"
LESSONS: Dict[str, int] = {"LSN-5 · Strings": 94, "LSN-6 · Hashes": 88,   # lesson -> the
                           "LSN-7 · Sorted sets": 97}                     # grader's score
GRADE_GAP_MS = 400           # the grader gets to one lesson every 0.4 s (delayed jobs)
# Part 7: a "come back to your course" nudge, debounced while the learner is active
# (dedupe="replace": each activity pushes the waiting nudge back; it goes once, when quiet)
NUDGE_LEARNER = "USR-barbara"
NUDGE_QUIET_MS = 1_500       # the nudge goes once the learner was quiet this long
ACTIVITY_PINGS, PING_GAP_MS = 3, 400


# --- what a run records -----------------------------------------------------------------
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


@dataclass
class ScheduleFacts:
    """What the boots showed: registry entries after each boot, and the listed schedules."""

    available: bool
    error: str = ""
    after_boot: List[Tuple[int, int]] = field(default_factory=list)  # (entries, weekly rows)
    listed: List[Dict[str, Any]] = field(default_factory=list)


@dataclass
class Waited:
    """What ``ref.wait()`` on the certificate gave the portal: its result, or the error,
    and when it woke (server clock)."""

    result: Any = None
    error: str = ""
    woke_ms: Optional[int] = None


@dataclass
class Ping:
    """One activity of the learner: the debounced nudge enqueued again (server clock before
    the call), the ref's status and job id."""

    at_ms: int
    status: str
    job_id: str


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
    grade_ids: List[str] = field(default_factory=list)
    cert_ref: Optional[JobRef] = None
    cert_waited: Waited = field(default_factory=Waited)
    pings: List[Ping] = field(default_factory=list)
    jobs: Dict[str, Job] = field(default_factory=dict)
    elapsed_s: float = 0.0
    timed_out: bool = False


@dataclass
class Check:
    """One expectation and whether it held."""

    label: str
    ok: bool
    detail: str


def retry_delays(sc: Scenario) -> List[Tuple[Run, Optional[int], Optional[int]]]:
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
