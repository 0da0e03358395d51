"""Sending enqueues that carry a dedupe key (the rules are in
:mod:`emqfast.facade.dedupe`). The script must declare the hash of the job holding the key,
so the caller first reads the key's holder in the ``dedupe`` hash and names it; when a
racing producer changed the holder in between, the script writes nothing and answers
``stale``, and the caller reads again and re-sends (a key changes holder at most once per
window, so this settles at once). Sans-IO steps of the enqueue operations.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from emqfast.core.errors import ServerBusy
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Cmd, Op, Returns
from emqfast.facade.admission import STATUS, Job, Shared, Wait, check_replicated, enqueue_call
from emqfast.facade.dedupe import STALE, STATUSES, holder_of
from emqfast.facade.job import JobRef

MAX_TRIES = 32  # re-sends after a stale reply before giving up (ServerBusy)
READ_CHUNK = 1000  # dedupe keys per HMGET


def ref_of(job_id: str, code: int, holder: Optional[str]) -> JobRef:
    """The ref of one enqueue reply: a deduplicated or replaced one names the holder."""
    if code in STATUSES and holder is not None:
        return JobRef(holder, STATUSES[code])
    return JobRef(job_id, STATUS.get(code, "duplicate"))


def admit_one(k: QueueKeys, job: Job, shared: Shared, key: Optional[str],
              wait: Wait) -> Returns[JobRef]:
    """Enqueue one job with expiry and/or a dedupe ``key``; its ref."""
    holder = holder_of((yield Cmd.of("HGET", k.dedupe, key))) if key is not None else None
    for _ in range(MAX_TRIES):
        call = enqueue_call(k, job, shared, True, key, holder)
        acked = None
        if wait is None:
            reply = yield call
        else:
            reply, acked = yield Batch([call], wait=wait)  # WAIT on the same connection
            if isinstance(reply, Exception):
                raise reply
        if int(reply) != STALE:
            ref = ref_of(job.id, int(reply), holder)
            check_replicated([ref], acked, wait)
            return ref
        holder = holder_of((yield Cmd.of("HGET", k.dedupe, key)))
    raise ServerBusy(f"dedupe key {key!r} changed holder {MAX_TRIES} times in a row: "
                     "nothing was written for this job; try again")


def read_holders(k: QueueKeys, keys: Sequence[Optional[str]]) -> Op:
    """The holder of each key (None where a job has no key, or the key is free)."""
    wanted = sorted({key for key in keys if key is not None})
    if not wanted:
        return [None] * len(keys)
    parts = [wanted[i:i + READ_CHUNK] for i in range(0, len(wanted), READ_CHUNK)]
    replies = yield Batch([Cmd.of("HMGET", k.dedupe, *part) for part in parts])
    found: Dict[str, Optional[str]] = {}
    for part, values in zip(parts, replies):
        found.update(zip(part, (holder_of(v) for v in values)))
    return [None if key is None else found[key] for key in keys]


def settle(k: QueueKeys, jobs: Sequence[Job], shared: Shared, keys: Sequence[Optional[str]],
           holders: List[Optional[str]], got: List[Any]) -> Op:
    """After one pipelined pass of a batch's keyed jobs: re-send each stale one alone until
    it settles (two jobs of one batch sharing a key: the second finds the first holding
    it). ``holders`` is updated in place to the holder each final reply was judged against;
    returns the final replies. (Those re-sends are not followed by WAIT.)"""
    out = list(got)
    for i, reply in enumerate(got):
        if reply != STALE or keys[i] is None:
            continue
        ref = yield from admit_one(k, jobs[i], shared, keys[i], None)
        if ref.status in STATUSES.values():
            holders[i] = ref.id
            out[i] = next(code for code, name in STATUSES.items() if name == ref.status)
        else:
            out[i] = next(code for code, name in STATUS.items() if name == ref.status)
    return out
