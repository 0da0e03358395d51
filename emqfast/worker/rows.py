""":class:`JobRows` turns ``start.lua`` rows into :class:`emqfast.Job` objects on the
worker's hot path, parsing each distinct options blob once (a bulk enqueue shares one).

A Job is built by filling a copy of a template instance's ``__dict__`` (every field at
its default) rather than through the dataclass ``__init__``: same object, same fields,
a third of the cost per job (issue 12: the worker's client CPU per job)."""
from __future__ import annotations

from typing import Any, Dict, Optional

from emqfast.core import codec
from emqfast.core.errors import PayloadError
from emqfast.facade import options
from emqfast.facade.job import Job

_Parsed = options.Options
_new_job = Job.__new__


class JobRows:
    """Builds the running :class:`Job` of one ``start.lua`` row, like ``Job.from_hash``."""

    _MAX_CACHED = 256

    def __init__(self, queue: str):
        self.queue = queue
        self._opts: Dict[bytes, _Parsed] = {}
        # every field at its default, as Job(...) would set it: copied per job
        self._template = dict(Job(id="", queue=queue, state="active", payload=None).__dict__)

    def _parse(self, opts: Optional[bytes]) -> _Parsed:
        key = opts or b""
        hit = self._opts.get(key)
        if hit is None:
            # no 'opts' (start.lua's nil) or an empty one: the library defaults
            hit = options.decode(opts)
            # Extra options may hold mutable values: each job parses its own.
            if not hit.extra:
                if len(self._opts) >= self._MAX_CACHED:
                    self._opts.clear()
                self._opts[key] = hit
        return hit

    def job(self, job_id: str, row: Any) -> Job:
        """``row`` = ``[attempts, payload, enc, opts, created, run_at, started, cancel]``
        from start.lua (``enc``, ``opts`` and ``run_at`` are None when the hash omits them:
        JSON, the default options, never delayed; rows of older scripts end after
        ``created`` or ``started``). A ``cancel`` mark (a cancel asked for while the job was
        held unstarted) sets ``_cancel_at_start``: the Worker stops the run as it begins."""
        attempts, payload, enc, opts, created, *times = row
        run_at, started = times[:2] if times else (None, None)
        fields = self._template.copy()
        try:
            fields["max_attempts"], fields["priority"], fields["backoff"], extra = \
                self._parse(opts)
            fields["payload"] = payload if enc == b"b" else codec.decode(payload, enc)
        except PayloadError as exc:  # one corrupt hash must not stop the worker
            fields["_undecodable"] = exc
            fields["max_attempts"], fields["priority"], fields["backoff"], extra = \
                self._parse(None)
            fields["payload"] = payload
        fields["id"] = job_id
        fields["attempts"] = int(attempts)
        fields["created_ms"] = int(created) if created is not None else None
        fields["run_at_ms"] = int(run_at) if run_at is not None else None
        fields["started_ms"] = int(started) if started is not None else None
        fields["extra"] = dict(extra) if extra else {}
        if len(times) > 2 and times[2]:
            fields["_cancel_at_start"] = True
        job = _new_job(Job)
        job.__dict__ = fields
        return job
