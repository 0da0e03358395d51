""":class:`JobRows` turns ``start.lua`` rows into :class:`emqfast.Job` objects on the
worker's hot path, parsing each distinct options blob once (a bulk enqueue shares one)."""
from __future__ import annotations

from typing import Any, Dict, Optional

from emqfast.core import codec
from emqfast.core.errors import PayloadError
from emqfast.facade import options
from emqfast.facade.job import Job

_Parsed = options.Options


class JobRows:
    """Builds the running :class:`Job` of one ``start.lua`` row, like ``Job.from_hash``."""

    _MAX_CACHED = 256

    def __init__(self, queue: str):
        self.queue = queue
        self._opts: Dict[bytes, _Parsed] = {}

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
        """``row`` = ``[attempts, payload, enc, opts, created, run_at, started]`` from
        start.lua (``enc``, ``opts`` and ``run_at`` are None when the hash omits them: JSON,
        the default options, never delayed; rows of older scripts end after ``created``)."""
        attempts, payload, enc, opts, created, *times = row
        run_at, started = times if times else (None, None)
        undecodable = None
        try:
            max_attempts, priority, backoff, extra = self._parse(opts)
            payload = codec.decode(payload, enc)
        except PayloadError as exc:  # one corrupt hash must not stop the worker
            undecodable = exc
            max_attempts, priority, backoff, extra = self._parse(None)
        return Job(id=job_id, queue=self.queue, state="active", _undecodable=undecodable,
                   payload=payload, attempts=int(attempts),
                   max_attempts=max_attempts, priority=priority, backoff=backoff,
                   created_ms=int(created) if created is not None else None,
                   run_at_ms=int(run_at) if run_at is not None else None,
                   started_ms=int(started) if started is not None else None,
                   extra=dict(extra))
