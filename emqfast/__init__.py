"""emqfast: a Redis job queue whose hot path is C.

    import emqfast
    q = emqfast.Queue("mail", emqfast.connect())
    q.enqueue({"to": "ada@example.com"})
    emqfast.Worker(q, lambda job: send(job.payload)).run()
"""
import sys as _sys

from emqfast.backends import select as backend  # callable: emqfast.backend() -> 'c' | 'python'
from emqfast.core import errors, redaction
from emqfast.facade import metrics
from emqfast.server import embedded
from emqfast.facade.backoff import Backoff
from emqfast.facade.bulk import promote_many
from emqfast.server.connection import connect
from emqfast.core.errors import (BackendUnavailable, ConnectionFailed, EmqError, EvictionRisk,
    InputTypeError, InvalidInput, JobNotFound, JobStateError, KeyTypeConflict, KindError,
    LeaseLost, PartialBatch, PayloadError, PermissionDenied, PoolExhausted, RangeError,
    ReplyLost, ServerBusy, ServerFull, Unrecoverable, VersionMismatch)
from emqfast.core.errors import Cancelled, JobTimeout  # issue 15: cancelling running jobs
from emqfast.facade.control import CancelResult
from emqfast.core.errors import DependencyCycle, UnknownDependency  # issue 15: dependencies
from emqfast.facade.flow import Flow, FlowJob
from emqfast.core.errors import JobExpired, JobFailed, WaitTimeout  # issue 15: ref.wait()
from emqfast.facade.waiting import wait_all
from emqfast.facade.job import Job, JobRef
from emqfast.facade.leaderboard import Entry, Leaderboard
from emqfast.facade.queue import Queue
from emqfast.core.version import KEYSPACE_VERSION, __version__
from emqfast.worker.threaded import Worker, WorkerStats


__all__ = [
    "Backoff", "BackendUnavailable", "ConnectionFailed", "EmqError", "Entry", "EvictionRisk",
    "InvalidInput", "Job", "PartialBatch", "PermissionDenied", "PoolExhausted", "ReplyLost",
    "ServerBusy",
    "ServerFull", "InputTypeError", "KeyTypeConflict",
    "JobNotFound", "JobRef", "JobStateError", "KEYSPACE_VERSION", "KindError", "Leaderboard",
    "LeaseLost",
    "PayloadError", "Queue", "RangeError", "Unrecoverable", "VersionMismatch", "Worker",
    "WorkerStats", "__version__", "backend", "connect", "embedded", "errors", "metrics",
    "promote_many", "redaction",
    "Cancelled", "CancelResult", "JobTimeout",
    "DependencyCycle", "Flow", "FlowJob", "UnknownDependency",
    "JobExpired", "JobFailed", "WaitTimeout", "wait_all",
]

# The public module names (``from emqfast.errors import ReplyLost``, ``emqfast.backend.use``,
# ``emqfast.metrics.Collector``, ``emqfast.embedded.stop()``, ``emqfast.redaction.redact``)
# are the layer modules themselves, registered under their short names: one module object.
_PUBLIC_MODULES = {"backend": backend, "errors": errors, "metrics": metrics,
                   "embedded": embedded, "redaction": redaction}
for _name, _module in _PUBLIC_MODULES.items():
    _sys.modules[f"emqfast.{_name}"] = _module
del _name, _module
