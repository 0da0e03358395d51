"""Parts 6 and 7 of ``emqfast demo`` (job flows in the Portal LMS story):

6. ada's course certificate depends on every lesson's grading job (``depends_on``): it waits
   as ``waiting_deps`` while the grader works through the lessons, runs once the last one
   is graded (its handler reads their results with ``job.dependency_results()``), and the
   portal's certificate page waits for it with ``ref.wait()``, woken by its end;
7. a "come back to your course" nudge is debounced while the learner is active: every
   activity enqueues it again with the same ``dedupe_key`` and ``dedupe="replace"``, which
   pushes the waiting nudge back, so it goes once, ``NUDGE_QUIET_MS`` after the last one.

What to enqueue, the two helpers that act while the worker plays (threads), the checks.
"""
from __future__ import annotations

import time
from typing import List

from emqfast.tools.demo_plan import (ACTIVITY_PINGS, CERT_LEARNER, DEADLINE_S, GRADE_GAP_MS,
                                     LESSONS, NUDGE_LEARNER, NUDGE_QUIET_MS, PING_GAP_MS,
                                     Check, Ping, Scenario)


def enqueue_certificate(sc: Scenario) -> None:
    """The grading jobs (the grader gets to one lesson every GRADE_GAP_MS) and the
    certificate that depends on all of them."""
    q = sc.queue
    grades = [q.enqueue_in({"kind": "grade", "learner": CERT_LEARNER, "lesson": lesson},
                           GRADE_GAP_MS * (i + 1)) for i, lesson in enumerate(LESSONS)]
    sc.grade_ids = [g.id for g in grades]
    sc.cert_ref = q.enqueue({"kind": "certificate", "learner": CERT_LEARNER},
                            depends_on=grades)  # status 'waiting_deps' until all graded


def wait_for_certificate(sc: Scenario) -> None:
    """The portal's certificate page: blocks on ``ref.wait()`` (no polling), woken by the
    certificate job's end."""
    assert sc.cert_ref is not None
    try:
        sc.cert_waited.result = sc.cert_ref.wait(timeout_s=DEADLINE_S)
    except Exception as exc:  # noqa: BLE001 - shown in the report and the checks
        sc.cert_waited.error = f"{type(exc).__name__}: {exc}"
    sc.cert_waited.woke_ms = sc.queue.server_time_ms()


def learner_active(sc: Scenario) -> None:
    """The learner clicks around: each activity re-enqueues the nudge with the same dedupe
    key, which pushes the waiting one back (debounce) instead of adding another."""
    for n in range(1, ACTIVITY_PINGS + 1):
        at = sc.queue.server_time_ms()
        ref = sc.queue.enqueue_in({"kind": "nudge", "learner": NUDGE_LEARNER, "activity": n},
                                  NUDGE_QUIET_MS, dedupe_key=f"nudge:{NUDGE_LEARNER}",
                                  dedupe="replace")
        sc.pings.append(Ping(at, ref.status, ref.id))
        if n < ACTIVITY_PINGS:
            time.sleep(PING_GAP_MS / 1000)  # the learner's next click


def checks(sc: Scenario) -> List[Check]:
    """Parts 6 and 7: the certificate's dependencies and wait, the debounced nudge."""
    tl, ref = sc.timeline, sc.cert_ref
    cert = sc.jobs.get(ref.id) if ref else None
    graded = [r.ended_ms or 0 for r in tl.of("grade") if r.outcome == "completed"]
    runs = [r for r in tl.of("certificate") if r.outcome == "completed"]
    waited = sc.cert_waited
    after = bool(runs and len(graded) == len(LESSONS) and runs[0].started_ms >= max(graded))
    out = [Check("the certificate waited for every grading, and ref.wait woke with it",
                 bool(ref and ref.status == "waiting_deps" and cert and cert.state == "completed"
                      and len(runs) == 1 and after and waited.result == runs[0].result
                      and waited.result.get("grades") == LESSONS),
                 f"enqueued {ref.status if ref else '?'}; {len(graded)}/{len(LESSONS)} graded; "
                 + (f"ref.wait: average {waited.result['average']:g}" if waited.result
                    else f"ref.wait: {waited.error or 'nothing'}"))]
    nudges, pings = tl.of("nudge"), sc.pings
    one_job = len({p.job_id for p in pings}) == 1 and len(pings) == ACTIVITY_PINGS
    quiet = (nudges[0].started_ms - pings[-1].at_ms) if nudges and pings else None
    out.append(Check("the nudge was debounced: one job, sent once, after the activity stopped",
                     bool(one_job and [p.status for p in pings[1:]] == ["replaced"] *
                          (ACTIVITY_PINGS - 1) and len(nudges) == 1 and quiet is not None
                          and quiet >= NUDGE_QUIET_MS
                          and nudges[0].result == {"to": NUDGE_LEARNER,
                                                   "after_activity": ACTIVITY_PINGS}),
                     f"{len(pings)} activities → {len({p.job_id for p in pings})} job "
                     f"({', '.join(p.status for p in pings)}); sent "
                     f"{quiet if quiet is not None else '?'} ms after the last "
                     f"(quiet {NUDGE_QUIET_MS} ms)"))
    return out
