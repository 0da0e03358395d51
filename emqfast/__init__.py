"""emqfast: a Redis job queue whose hot path is C.

    import emqfast
    q = emqfast.Queue("mail", emqfast.connect())
    q.enqueue({"to": "ada@example.com"})
    emqfast.Worker(q, lambda job: send(job.payload)).run()
"""
from emqfast import backend, errors  # public modules; emqfast.backend() -> 'c' | 'python'
from emqfast.facade.backoff import Backoff
from emqfast.facade.bulk import promote_many
from emqfast.server.connection import connect
from emqfast.core.errors import (BackendUnavailable, ConnectionFailed, EmqError, EvictionRisk,
    InvalidInput, JobNotFound, JobStateError, KindError, LeaseLost, PartialBatch, PayloadError,
    PermissionDenied, RangeError, ReplyLost, ServerBusy, ServerFull, Unrecoverable,
    VersionMismatch)
from emqfast.facade.job import Job, JobRef
from emqfast.facade.leaderboard import Entry, Leaderboard
from emqfast.facade.queue import Queue
from emqfast.core.version import KEYSPACE_VERSION, __version__
from emqfast.worker.threaded import Worker, WorkerStats


__all__ = [
    "Backoff", "BackendUnavailable", "ConnectionFailed", "EmqError", "Entry", "EvictionRisk",
    "InvalidInput", "Job", "PartialBatch", "PermissionDenied", "ReplyLost", "ServerBusy",
    "ServerFull",
    "JobNotFound", "JobRef", "JobStateError", "KEYSPACE_VERSION", "KindError", "Leaderboard",
    "LeaseLost",
    "PayloadError", "Queue", "RangeError", "Unrecoverable", "VersionMismatch", "Worker",
    "WorkerStats", "__version__", "backend", "connect", "errors", "promote_many",
]
