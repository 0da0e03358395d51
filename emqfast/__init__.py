"""emqfast: a Redis job queue whose hot path is C.

    import emqfast
    q = emqfast.Queue("mail", emqfast.connect())
    q.enqueue({"to": "ada@example.com"})
    emqfast.Worker(q, lambda job: send(job.payload)).run()
"""
from . import backend  # a module you can call: emqfast.backend() -> 'c' | 'python'
from .backoff import Backoff
from .bulk import promote_many
from .connection import connect
from .errors import (BackendUnavailable, ConnectionFailed, EmqError, EvictionRisk, InvalidInput,
                     JobNotFound, JobStateError, KindError, LeaseLost, PartialBatch, PayloadError,
                     PermissionDenied, RangeError, ReplyLost, ServerBusy, ServerFull,
                     Unrecoverable, VersionMismatch)
from .job import Job, JobRef
from .leaderboard import Entry, Leaderboard
from .queue import Queue
from .version import KEYSPACE_VERSION, __version__
from .worker import Worker, WorkerStats


__all__ = [
    "Backoff", "BackendUnavailable", "ConnectionFailed", "EmqError", "Entry", "EvictionRisk",
    "InvalidInput", "Job", "PartialBatch", "PermissionDenied", "ReplyLost", "ServerBusy",
    "ServerFull",
    "JobNotFound", "JobRef", "JobStateError", "KEYSPACE_VERSION", "KindError", "Leaderboard",
    "LeaseLost",
    "PayloadError", "Queue", "RangeError", "Unrecoverable", "VersionMismatch", "Worker",
    "WorkerStats", "__version__", "backend", "connect", "promote_many",
]
