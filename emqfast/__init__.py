"""emqfast: a Redis job queue whose hot path is C.

    import emqfast
    q = emqfast.Queue("mail", emqfast.connect())
    q.enqueue({"to": "ada@example.com"})
    emqfast.Worker(q, lambda job: send(job.payload)).run()
"""
import sys as _sys

# the queue and its jobs
from emqfast.facade.queue import Queue
from emqfast.facade.partitioned import PartitionedQueue
from emqfast.facade.job import Job, JobRef
from emqfast.facade.options import Backoff
from emqfast.facade.control import CancelResult
from emqfast.facade.flow import Flow, FlowJob
from emqfast.facade.job_wait import wait_all
from emqfast.facade.promote import promote_many
from emqfast.facade.leaderboard import Entry, Leaderboard
# running jobs
from emqfast.worker.threads import Worker, WorkerStats
# connecting, and the modules with public names of their own
from emqfast.server.connection import connect
from emqfast.backends import select as backend  # callable: emqfast.backend() -> 'c' | 'python'
from emqfast.core import errors, redaction
from emqfast.facade import metrics
from emqfast.server import embedded
from emqfast.core.version import KEYSPACE_VERSION, __version__
# errors: one base (EmqError), then by what they say
from emqfast.core.errors import (BackendUnavailable, Cancelled, CertificateRejected,
    ConnectionFailed,
    DependencyCycle, DependencyFailed, EmqError, EvictionRisk, InputTypeError, InvalidInput,
    HandlerNotImportable, JobExpired, JobFailed, JobNotFound, JobStateError, JobTimeout,
    KeyTypeConflict, KindError, LeaseLost,
    PartialBatch, PartitionMismatch, PayloadError, PermissionDenied, PoolExhausted,
    QueueKeysGone, RangeError,
    ReplyLost, ServerBusy, ServerFull,
    UnknownDependency, Unrecoverable, VersionMismatch, WaitTimeout, WorkerCrashed)

__all__ = [
    # the queue and its jobs
    "Queue", "PartitionedQueue", "Job", "JobRef", "Backoff", "CancelResult", "Flow", "FlowJob", "wait_all",
    "promote_many", "Entry", "Leaderboard",
    # running jobs
    "Worker", "WorkerStats",
    # connecting, and the modules with public names of their own
    "connect", "backend", "errors", "redaction", "metrics", "embedded", "KEYSPACE_VERSION",
    "__version__",
    # errors
    "EmqError", "BackendUnavailable", "Cancelled", "CertificateRejected", "ConnectionFailed",
    "DependencyCycle",
    "DependencyFailed", "EvictionRisk", "HandlerNotImportable", "InputTypeError", "InvalidInput", "JobExpired",
    "JobFailed", "JobNotFound",
    "JobStateError", "JobTimeout", "KeyTypeConflict", "KindError", "LeaseLost", "PartialBatch",
    "PartitionMismatch",
    "PayloadError", "PermissionDenied", "PoolExhausted", "QueueKeysGone", "RangeError",
    "ReplyLost", "ServerBusy", "ServerFull",
    "UnknownDependency", "Unrecoverable", "VersionMismatch", "WaitTimeout", "WorkerCrashed",
]

# The public module names (``from emqfast.errors import ReplyLost``, ``emqfast.backend.use``,
# ``emqfast.metrics.Collector``, ``emqfast.embedded.stop()``, ``emqfast.redaction.redact``)
# are the layer modules themselves, registered under their short names: one module object.
_PUBLIC_MODULES = {"backend": backend, "errors": errors, "metrics": metrics,
                   "embedded": embedded, "redaction": redaction}
for _name, _module in _PUBLIC_MODULES.items():
    _sys.modules[f"emqfast.{_name}"] = _module
del _name, _module
