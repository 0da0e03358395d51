"""Typed errors. Lua scripts reply with ``<CODE> message``; :func:`from_reply` maps
the code prefix to the class below, so callers never parse strings."""
from __future__ import annotations

import re
from typing import Any, Dict, Optional, Sequence, Tuple, Type


class EmqError(Exception):
    """Base class of every error emqfast raises on purpose."""

    code = "EMQ"


class InvalidInput(EmqError, ValueError):
    """An argument is malformed; nothing was written to Redis."""

    code = "EMQINPUT"


class InputTypeError(InvalidInput, TypeError):
    """An argument of the wrong type (e.g. one payload where a list is taken); a
    ``TypeError`` too, as Python would have raised; nothing was written to Redis."""

    code = "EMQINPUT"


class KindError(InvalidInput):
    """A job id that does not carry the ``JOB`` brand."""

    code = "EMQKIND"


class RangeError(InvalidInput):
    """A number outside the range the keyspace can represent exactly."""

    code = "EMQRANGE"


class PayloadError(InvalidInput):
    """A payload that is neither bytes nor JSON-serialisable, or too large."""

    code = "EMQPAYLOAD"


class JobNotFound(EmqError, LookupError):
    """The job id does not exist in this queue."""

    code = "EMQNOJOB"


class LeaseLost(EmqError):
    """The caller's lease on a job expired and was taken over (or the job ended)."""

    code = "EMQLEASE"


class QueueKeysGone(LeaseLost):
    """A job in hand vanished while leased: the keys of its queue are gone (a server
    restart without persistence, ``FLUSHDB``, ``Queue.obliterate()``); the message says
    whether the queue's meta hash and version fence vanished too. Its outcome is discarded
    like any lost lease's, but the cause is the queue's, not the job's."""

    code = "EMQGONE"


class JobStateError(EmqError):
    """The job is not in a state that allows the operation (e.g. retry a pending job)."""

    code = "EMQSTATE"


class DependencyFailed(JobStateError):
    """``retry()`` of a job that failed because a dependency did not complete (its error
    is ``dependency failed``): refused, nothing written. Running it again would hand its
    handler no result for that dependency. Retry (or enqueue again) the dependency, then
    enqueue the job again with ``depends_on``. ``dependencies``: the ``(queue, job_id)``
    pairs of its dependencies that did not complete, when known."""

    code = "EMQDEPFAILED"

    def __init__(self, message: str, dependencies: Sequence[Any] = ()):
        super().__init__(message)
        self.dependencies = list(dependencies)


class VersionMismatch(EmqError):
    """The queue was written by an incompatible major version of the keyspace."""

    code = "EMQVERSION"


class PartitionMismatch(VersionMismatch):
    """The queue's partition layout is not the one this client opened it with: another
    number of partitions, or a partitioned queue opened as a plain one (or the reverse).
    Nothing was written; see the docs' "Changing the number of partitions"."""

    code = "EMQPARTITIONS"


class BackendUnavailable(EmqError, ImportError):
    """``EMQFAST_BACKEND=c`` was asked for but the C extension is not built."""

    code = "EMQBACKEND"


class ConnectionFailed(EmqError, ConnectionError):
    """Redis could not be reached (the message never contains credentials).

    ``sent`` says whether the request may have reached Redis: ``False`` when it
    certainly did not run (the connection failed before it was written), ``True``
    when it was written and its reply was lost (see :class:`ReplyLost`)."""

    code = "EMQCONN"
    sent = False


class ReplyLost(ConnectionFailed):
    """The request was sent but its reply never arrived: it may or may not have run.

    emqfast never re-sends such a request blindly; recover by reading state (a job
    enqueued with your own ``job_id`` can be re-sent: it is idempotent by id)."""

    code = "EMQLOST"
    sent = True


class ServerBusy(EmqError, ConnectionError):
    """Redis refused the command for a transient reason and did not run it: loading its
    dataset after a restart (LOADING), busy in a long script (BUSY), a failover in
    progress (READONLY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN). Safe to retry later;
    Workers wait these out. ``state`` is the server's error code."""

    code = "EMQBUSY"

    def __init__(self, message: str, state: str = ""):
        super().__init__(message)
        self.state = state


class PoolExhausted(EmqError):
    """The client's connection pool is full (redis-py's ``MaxConnectionsError``): every
    one of its ``max_connections`` connections is in use, so this call was not sent.
    Not a network failure and not retried: give the client a larger pool
    (``max_connections=``), or fewer threads or tasks using it at once."""

    code = "EMQPOOL"


class ServerFull(EmqError):
    """Redis is at ``maxmemory`` with ``noeviction`` (OOM) and refused the write; nothing
    of the refused call was written. Workers wait this out for their outcome writes."""

    code = "EMQFULL"


class PermissionDenied(EmqError, PermissionError):
    """Redis refused the command for lack of rights (an ACL user without it, NOPERM) or
    of credentials (wrong or missing password). Permanent: retrying cannot help."""

    code = "EMQPERM"


class CertificateRejected(PermissionDenied):
    """The TLS handshake failed on a certificate: the server's is not signed by the CA
    given (``ssl_ca_certs``), has expired or names another host, or the server refused
    the client's (missing, or not signed by its CA). Permanent, as a wrong password is:
    retrying cannot help, so Workers stop with it (it is a :class:`PermissionDenied`).
    Fix the certificates or the TLS settings (``ssl_ca_certs``, ``ssl_certfile`` /
    ``ssl_keyfile``, ``ssl_check_hostname``)."""

    code = "EMQTLS"


class EvictionRisk(EmqError):
    """The server's ``maxmemory-policy`` may evict emqfast's keys (jobs would vanish).
    Workers refuse such a server unless started with ``allow_eviction=True``."""

    code = "EMQEVICT"


class PartialBatch(EmqError):
    """A batch call failed part-way. Nothing it reports is guessed:

    - ``landed``: the :class:`~emqfast.JobRef` objects whose reply arrived (written);
    - ``unknown``: ids whose request was sent but whose reply was lost (may be written;
      re-sending them with the same ids is safe and never reports them wrongly);
    - ``not_sent``: ids that never reached Redis;
    - ``__cause__``: the underlying error (e.g. :class:`ServerFull`, :class:`ReplyLost`).
    """

    code = "EMQPARTIAL"
    # set by enqueue_many (facade/enqueue_batch.py) for retry_partial; absent on one made
    # elsewhere, which retry_partial refuses (it reads them with getattr)
    batch: Any
    queue: str

    def __init__(self, message: str, landed: Sequence[Any] = (), unknown: Sequence[str] = (),
                 not_sent: Sequence[str] = ()):
        super().__init__(message)
        self.landed = list(landed)
        self.unknown = list(unknown)
        self.not_sent = list(not_sent)


class NotReplicated(EmqError):
    """A write a queue made with ``wait_replicas=n`` reached the master, but fewer than
    ``n`` replicas acknowledged it within ``wait_timeout_ms`` (Redis ``WAIT``). The jobs
    ARE written (``landed``: their :class:`~emqfast.JobRef` objects); they may be lost if
    the master fails before replicating them. ``acked``/``wanted``: replica counts."""

    code = "EMQREPL"

    def __init__(self, message: str, landed: Sequence[Any] = (), acked: int = 0,
                 wanted: int = 0):
        super().__init__(message)
        self.landed = list(landed)
        self.acked = acked
        self.wanted = wanted


class Cancelled(EmqError):
    """A job was cancelled while it ran (``q.cancel(job_id)`` on an active job) or ran past
    its ``timeout_ms`` (then the subclass :class:`JobTimeout`). A running handler gets it
    from ``job.raise_if_cancelled()``; ``reason`` is ``"cancelled"`` or ``"timeout"``."""

    code = "EMQCANCELLED"
    reason = "cancelled"


class JobTimeout(Cancelled, TimeoutError):
    """A job ran past its ``timeout_ms`` (``enqueue(..., timeout_ms=N)`` or the Worker's
    ``job_timeout_ms``): its run is over; the job fails (or retries) with error
    ``timeout``."""

    code = "EMQTIMEOUT"
    reason = "timeout"


class WorkerCrashed(EmqError):
    """A handler process of a ``Worker(processes=N)`` died while it ran the job (a signal,
    ``os._exit``, the OOM killer): that attempt failed with it, and the job is retried per
    its attempts. The error names the exit status and the job."""

    code = "EMQCRASHED"


class HandlerNotImportable(EmqError, ImportError):
    """A ``Worker(processes=N)`` could not start its handler processes: a child failed to
    import the handler by its path (the message holds the child's traceback), or did not
    start in time. :meth:`Worker.run <emqfast.Worker.run>` raises it instead of
    restarting children in a loop."""

    code = "EMQHANDLERIMPORT"


class KeyTypeConflict(EmqError, TypeError):
    """Redis refused a command because a key of the queue holds another type than emqfast
    keeps there (``WRONGTYPE``): something other than emqfast wrote under the queue's
    ``emq:{<queue>}:*`` keys. Use another queue name, or delete those keys."""

    code = "EMQKEYTYPE"


class JobFailed(EmqError):
    """``ref.wait()``: the job failed for good (no attempt left, or ``Unrecoverable``).
    ``error`` and ``traceback`` are what its last run recorded; ``job_id`` names it."""

    code = "EMQFAILED"

    def __init__(self, message: str, job_id: str = "", error: Optional[str] = None,
                 traceback: Optional[str] = None):
        super().__init__(message)
        self.job_id, self.error, self.traceback = job_id, error, traceback


class JobExpired(EmqError):
    """``ref.wait()``: the job expired (not started within its ``expires_ms``): never run."""

    code = "EMQEXPIRED"

    def __init__(self, message: str, job_id: str = ""):
        super().__init__(message)
        self.job_id = job_id


class WaitTimeout(EmqError, TimeoutError):
    """``ref.wait(timeout_s=...)`` / ``wait_all``: the time ran out before the job(s)
    ended; ``job_ids`` names those still running or waiting (nothing was changed)."""

    code = "EMQWAITTIMEOUT"

    def __init__(self, message: str, job_ids: Sequence[str] = ()):
        super().__init__(message)
        self.job_ids = list(job_ids)


class UnknownDependency(InvalidInput, LookupError):
    """``enqueue(..., depends_on=[...])`` / ``Flow.enqueue()`` named a dependency that does
    not exist; ``missing`` lists its ``(queue, job_id)`` pairs. Nothing was written."""

    code = "EMQNODEP"

    def __init__(self, message: str, missing: Sequence[Any] = ()):
        super().__init__(message)
        self.missing = list(missing)


class DependencyCycle(InvalidInput):
    """A :class:`emqfast.Flow` (or a job depending on itself) whose dependencies form a
    cycle: such jobs could never run. Refused before anything is written."""

    code = "EMQCYCLE"


_BY_CODE: Dict[str, Type[EmqError]] = {
    cls.code: cls
    for cls in (InvalidInput, KindError, RangeError, PayloadError, JobNotFound,
                LeaseLost, QueueKeysGone, JobStateError, DependencyFailed, VersionMismatch,
                PartitionMismatch, KeyTypeConflict)
}


def codes() -> Dict[str, Type[EmqError]]:
    """Every error code a Lua script may reply with, and its class."""
    return dict(_BY_CODE)


def from_reply(message: str) -> Exception | None:
    """Typed exception for a Lua error reply, or ``None`` if it is not ours."""
    code, _, text = message.partition(" ")
    cls = _BY_CODE.get(code)
    return cls(text or code) if cls else None


class Unrecoverable(Exception):
    """Raise from a handler to fail the job at once, skipping any remaining attempts."""


# How Redis words an ACL denial of a command a script calls (no NOPERM code prefix).
_SCRIPT_NOPERM = "user executing the script can't run this command"

# Redis error-reply codes of transient server states: the command did not run.
TRANSIENT_STATES = ("LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY")


def translate(exc: BaseException, sent: bool = True) -> BaseException:
    """emqfast's typed error for a redis-py (or C batcher) exception; others unchanged.

    ``sent`` is whether the request had been written when the connection failed: a
    connection error after the write is :class:`ReplyLost` (it may have run), before it
    :class:`ConnectionFailed`. Error replies of transient states become
    :class:`ServerBusy`, OOM :class:`ServerFull`, NOPERM and authentication failures
    :class:`PermissionDenied`, our own ``EMQ*`` codes their classes. An error reply is
    classified by its server code wherever it arrived: alone, from a script, or worded
    by redis-py as one command of a pipeline."""
    import redis.exceptions as rx  # here, not at import: errors is the lowest module

    rejected = certificate_rejected(exc)
    if rejected is not None:
        return rejected
    if isinstance(exc, EmqError):
        return exc
    text = str(exc)
    if is_torn_connection(exc):
        return (ReplyLost if sent else ConnectionFailed)(
            f"the connection was closed under the call ({type(exc).__name__}: {text}): "
            "redis-py's client closed its connections meanwhile (a Cluster client does on "
            "CLUSTERDOWN, during a failover)")
    if isinstance(exc, (rx.RedisClusterException, rx.ClusterError)) \
            and not isinstance(exc, rx.ResponseError):  # (a reply: classified below)
        return _cluster_failure(exc, rx, sent)
    if isinstance(exc, rx.BusyLoadingError):
        return ServerBusy(f"redis is loading its dataset: {text}", "LOADING")
    if isinstance(exc, (rx.AuthenticationError, rx.AuthorizationError,
                        rx.AuthenticationWrongNumberOfArgsError, rx.NoPermissionError)):
        return PermissionDenied(_password_hint(text))
    if isinstance(exc, rx.OutOfMemoryError):
        return ServerFull(text)
    if isinstance(exc, getattr(rx, "MaxConnectionsError", ())):  # (redis-py >= 6)
        return pool_exhausted(None, exc)
    if isinstance(exc, (rx.ConnectionError, rx.TimeoutError, ConnectionError, TimeoutError)):
        cls = ReplyLost if sent else ConnectionFailed
        return cls(f"{type(exc).__name__}: {text}")
    if isinstance(exc, rx.ResponseError):
        return _reply_error(exc, rx) or exc
    return exc


def is_torn_connection(exc: BaseException) -> bool:
    """Whether ``exc`` is redis-py using a connection that was closed under it: an
    AttributeError or TypeError on a ``None`` reader, writer or socket raised while
    redis-py's code was running (``'NoneType' object has no attribute 'writelines'``),
    from redis-py itself or the asyncio transport beneath it; not a bug of ours."""
    if not isinstance(exc, (AttributeError, TypeError)) or "'NoneType' object" not in str(exc):
        return False
    files = []
    tb = exc.__traceback__
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename.replace("\\", "/"))
        tb = tb.tb_next
    return bool(files) and any("/redis/" in f for f in files) and \
        ("/redis/" in files[-1] or "/asyncio/" in files[-1])


def _cluster_failure(exc: BaseException, rx: Any, sent: bool) -> BaseException:
    """redis-py's Cluster client's own failures (not server replies): no node reachable is
    :class:`ConnectionFailed` (nothing was sent); a slot no node serves (a failover under
    way) :class:`ServerBusy` ``CLUSTERDOWN``; others (a request over many slots: the
    caller's) unchanged."""
    text = str(exc)
    if isinstance(exc, getattr(rx, "RedisClusterUnreachableError", ())) \
            or "cannot be connected" in text:
        return ConnectionFailed(f"{type(exc).__name__}: {text}")
    if isinstance(exc, rx.SlotNotCoveredError) or "not covered by the cluster" in text:
        return ServerBusy(f"{type(exc).__name__}: {text}", "CLUSTERDOWN")
    if "TTL exhausted" in text:  # redirected and failed over past its retries
        return (ReplyLost if sent else ConnectionFailed)(f"{type(exc).__name__}: {text}")
    return exc


def _reply_error(exc: BaseException, rx: Any) -> Optional[EmqError]:
    """The typed error for a server's error reply, or ``None`` if it is none of ours."""
    head, text = server_reply(exc)
    state = head if head in TRANSIENT_STATES else _TRANSIENT_CLASSES.get(type(exc).__name__)
    if state is None and isinstance(exc, (rx.ReadOnlyError, rx.ClusterDownError,
                                          rx.TryAgainError)):
        state = type(exc).__name__
    if state is not None:
        return ServerBusy(str(exc), state)
    if head == "OOM":
        return ServerFull(str(exc))
    if head == "WRONGTYPE" or "WRONGTYPE" in text:
        return KeyTypeConflict(
            f"{text} -- a key of this queue holds another Redis type than emqfast keeps "
            "there: another program wrote under emq:{<queue>}:*. Use another queue "
            "name, or delete those keys (Queue.obliterate()) if nothing needs them")
    # (an ACL denial inside a script has no code prefix: Redis words it this way)
    if head in ("NOPERM", "NOAUTH", "WRONGPASS") or _SCRIPT_NOPERM in text \
            or _password_hint(text) is not text:
        return PermissionDenied(_password_hint(text))
    typed = from_reply(text)
    return typed if isinstance(typed, EmqError) else None


# redis-py's classes for transient replies whose text it strips of the code
_TRANSIENT_CLASSES = {"ReadOnlyError": "READONLY", "MasterDownError": "MASTERDOWN",
                      "ClusterDownError": "CLUSTERDOWN", "TryAgainError": "TRYAGAIN"}
# redis-py words an error reply of one command of a pipeline (sync, asyncio, Cluster)
# "Command # <n> (<command>) of pipeline caused error: <reply>"; greedy, so a command
# text that happens to hold the phrase does not hide the reply after it
_PIPELINE_WORDING = re.compile(r"Command # \d+ \(.*\) of pipeline caused error: ", re.S)
# a server before Redis 7 words an error of a command a script calls
# "ERR Error running script (...): @user_script:<n>: ... -<CODE> <message>" (redis-py 8
# strips the "ERR ")
_SCRIPT_WORDING = re.compile(r"(?:ERR )?Error running script .*?: -([A-Z][A-Z0-9_]*) (.*)",
                             re.S)


def server_reply(exc: BaseException) -> Tuple[str, str]:
    """``(code, text)`` of the error reply a redis-py (or C batcher) exception carries,
    unwrapped from redis-py's pipeline wording and an old server's script wording:
    ``code`` is the reply's first word (``"BUSY"``, ``"EMQINPUT"``; redis-py keeps it in
    ``status_code`` where it strips it from the text) and ``text`` the reply."""
    text = str(exc)
    wrapped = _PIPELINE_WORDING.match(text)
    if wrapped:
        text = text[wrapped.end():]
    script = _SCRIPT_WORDING.match(text)
    if script:
        return script.group(1), f"{script.group(1)} {script.group(2)}"
    head = text.split(" ", 1)[0]
    code = getattr(exc, "status_code", None)
    return (code if isinstance(code, str) and code else head), text


# How OpenSSL words a certificate failure, seen from either side of the handshake: this
# client's check of the server's certificate, or the server's alert refusing ours. A
# handshake cut by the network (EOF, reset) says none of these: it stays transient.
_CERTIFICATE_WORDING = re.compile(
    r"certificate verify failed|CERTIFICATE_VERIFY_FAILED|alert (?:certificate required|"
    r"bad certificate|unknown ca|certificate expired|certificate unknown|certificate "
    r"revoked|unsupported certificate)|ALERT_(?:CERTIFICATE_REQUIRED|BAD_CERTIFICATE|"
    r"UNKNOWN_CA|CERTIFICATE_EXPIRED|CERTIFICATE_UNKNOWN|CERTIFICATE_REVOKED|"
    r"UNSUPPORTED_CERTIFICATE)")


def certificate_rejected(exc: BaseException) -> Optional[CertificateRejected]:
    """:class:`CertificateRejected` when ``exc`` (a connection failure from redis-py, the
    C batcher or :mod:`ssl`, or one in its cause chain) is a TLS certificate failure,
    else ``None``."""
    import ssl

    import redis.exceptions as rx

    if isinstance(exc, CertificateRejected):
        return exc
    connection_failures = (rx.ConnectionError, OSError, ConnectionFailed)  # ssl's: OSError
    seen = 0
    link: Optional[BaseException] = exc
    while link is not None and seen < 8:  # (a chain is short; a cycle is not followed)
        if isinstance(link, ssl.SSLCertVerificationError) or (
                isinstance(link, connection_failures)
                and _CERTIFICATE_WORDING.search(str(link))):
            return CertificateRejected(
                f"TLS certificate failure: {exc} -- permanent: fix the certificates or the "
                "TLS settings (ssl_ca_certs, ssl_certfile/ssl_keyfile, ssl_check_hostname)")
        link = link.__cause__ or link.__context__
        seen += 1
    return None


def pool_exhausted(max_connections: int | None, exc: BaseException) -> PoolExhausted:
    """:class:`PoolExhausted` naming the pool's size when known; nothing was sent."""
    size = f"all {max_connections}" if max_connections is not None else "all"
    return PoolExhausted(f"the redis client's connection pool is exhausted ({size} of its "
                         f"connections are in use; {type(exc).__name__}: {exc}): nothing "
                         "was sent. Give the client a larger pool (max_connections=...) or "
                         "use it from fewer threads or tasks at once")


def is_transient(exc: BaseException) -> bool:
    """True when waiting and trying again may succeed: a lost connection, a transient
    server state, a full server (memory may be freed). Authentication, permission and
    input errors are permanent."""
    exc = translate(exc)
    return isinstance(exc, (ConnectionFailed, ServerBusy, ServerFull))


def _password_hint(text: str) -> str:
    """A server's "needs a password" reply ("HELLO must be called with the client already
    authenticated...", NOAUTH, a cut unauthenticated pipeline) in plain words, saying how
    to pass one; any other text unchanged (the same object)."""
    from emqfast.core.diagnose import HOW_TO_PASS_A_PASSWORD, password_missing

    if not password_missing(text):
        return text
    return f"the Redis server requires a password and none was given: {HOW_TO_PASS_A_PASSWORD}"
