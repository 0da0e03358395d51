"""Planning a pump pass (sans-IO): which occurrences of a due schedule to mint, as
compare-and-set calls of schedule_mint.lua, and how many of them minted a job. The
:class:`~emqfast.facade.schedules.Schedules` facade reads the registry and sends them."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from emqfast.backends.scripts import load
from emqfast.core.cadence import plan
from emqfast.core.errors import VersionMismatch
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Call
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade.schedule_spec import Schedule, occurrence_job_id

log = logging.getLogger("emqfast.schedules")

_MINT = load("schedule_mint")

SWEEP_BATCH = 1000  # due schedule names read per due.lua call (it refuses more than 4,000)
MINT_BATCH = 1000   # schedule_mint.lua calls per pipelined round trip


@dataclass(frozen=True)
class Sweep:
    """What one pump pass did, for callers that schedule their own next pass."""

    minted: int                   # jobs created
    now_ms: int                   # server clock when the pass read the registry
    next_run_ms: Optional[int]    # earliest registry entry afterwards (None: no schedules)
    more: bool                    # more schedules were due than ``limit``


def mint_calls(k: QueueKeys, name: str, h: Dict[bytes, bytes], score: Optional[float],
               now: int) -> List[Call]:
    """The CAS chain minting ``name``'s due occurrence(s), per its missed policy, from its
    record ``h`` and registry ``score`` as read at server time ``now``."""
    if not h or score is None or score == float("inf"):
        if not h:
            log.warning("emqfast: schedule %r has a registry entry but no record", name)
        return []
    try:
        sched = Schedule.from_record(name, h, score)
        steps = plan(sched.cadence_obj(), int(score), now, sched.missed, sched.catch_up_limit)
    except (ValueError, KeyError, TypeError, AssertionError) as exc:
        # one damaged record must not stop the pump (or the worker beat) for the rest
        log.error("emqfast: schedule %r cannot be planned: %s", name, exc)
        return []
    gen = h.get(b"gen", b"").decode()
    calls = []
    for expected, occ, nxt in steps:
        job_id = occurrence_job_id(name, occ)
        calls.append(Call(_MINT, [k.repeat, k.schedule(name), k.job(job_id), k.pending,
                                  k.delayed, k.marker, k.meta, k.counter, k.events],
                          [name, expected, gen, occ, -1 if nxt is None else nxt, job_id,
                           KEYSPACE_VERSION]))
    return calls


def count_minted(replies: Sequence[Any]) -> int:
    """How many schedule_mint.lua replies minted a job (1); a failed mint is logged and
    skipped (the next pump retries it), a keyspace of another version raised."""
    minted = 0
    for reply in replies:
        if isinstance(reply, VersionMismatch):
            raise reply
        if isinstance(reply, Exception):
            log.error("emqfast: minting a schedule occurrence failed: %s", reply)
        elif reply == 1:
            minted += 1
    return minted
