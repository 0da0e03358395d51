"""Security: payloads are never unpickled, a Redis ACL user limited to ``emq:*`` keys
runs everything, passwords never reach logs or exception messages, and TLS
(``rediss://``) works through the redis-py path (the C Batcher refuses it).

Each test starts its own private redis-server (ACL, requirepass or TLS)."""
from __future__ import annotations

import ast
import importlib
import logging
import pickle
import shutil
import subprocess
import tempfile
import threading
import traceback
from pathlib import Path

import pytest
import redis

import emqfast
from emqfast import ConnectionFailed, Leaderboard, Queue, Worker

from conftest import _free_port, native_built, start_redis_server
from lua_static import readme_least_privilege, readme_simple_rule
from waiting import wait_until

backend_mod = importlib.import_module("emqfast.backend")
PACKAGE = Path(emqfast.__file__).resolve().parent



@pytest.fixture
def server_factory():
    """Start private redis-servers with extra arguments; all stopped at teardown."""
    procs = []

    def start(*args, port=None, workdir=None):
        proc, port, workdir = start_redis_server(list(args), port=port, workdir=workdir)
        procs.append((proc, workdir))
        return proc, port, workdir

    yield start
    for proc, workdir in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


# --- payloads are never unpickled -------------------------------------------------------

class _Exploit:
    """Unpickling this calls ``open(path, 'w')``: a file appearing proves code ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickle_payload_comes_back_as_bytes_and_nothing_executes(r, qname, tmp_path):
    canary = tmp_path / "pwned"
    evil = pickle.dumps(_Exploit(str(canary)), protocol=4)
    assert evil.startswith(b"\x80\x04")
    q = Queue(qname, r)
    ref = q.enqueue(evil)
    q.enqueue_many([evil, evil])
    assert q.get(ref.id).payload == evil
    seen = []
    Worker(q, lambda job: seen.append(job.payload)).run_until_idle(20)
    assert seen == [evil] * 3 and all(isinstance(p, bytes) for p in seen)
    # a job hash whose encoding tag was tampered with is still not unpickled
    r.hset(q.keys.job(ref.id), mapping={"enc": "p"})
    with pytest.raises(Exception):
        q.get(ref.id)
    assert not canary.exists()


def test_no_module_of_the_package_can_unpickle():
    banned = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "jsonpickle", "marshal",
              "shelve"}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            offenders += [f"{path.name}: {n}" for n in names if n in banned]
    assert offenders == []


# --- a Redis ACL user restricted to emq:* keys --------------------------------------------

# The least-privilege command set emqfast needs: the README's rule itself (README
# "Security"), so the documented rule is the one tested. tests/test_script_safety.py checks
# that it holds every command the scripts and the library can send.
MINIMAL_ACL = readme_least_privilege()
BROAD_ACL = readme_simple_rule()
OPTIONAL_COMMANDS: set = set()  # the README's rule is exactly what emqfast sends


def exercise_everything(url: str) -> None:
    """Every public operation, under both backends, as the restricted user: enqueue (plain,
    delayed, bulk, grouped), groups with caps and rate limits, schedules, leaderboards,
    events, metrics, pause/resume, rate limits, cancel/retry, promote/reap/trim."""
    conn = emqfast.connect(url)
    q = Queue("acl-q", conn)
    previous = backend_mod.current()
    try:
        for name in ("python", "c") if native_built() else ("python",):
            backend_mod.use(name)
            q.enqueue({"a": 1})
            q.enqueue_in(b"later", 50)
            q.enqueue_many([1, 2, 3])
            q.enqueue({"g": 1}, group="tenant-a")
            q.enqueue_many([{"g": 2}, {"g": 3}], group="tenant-b")
            q.enqueue_in({"g": 4}, 50, group="tenant-a")
            emqfast.promote_many(conn, [q, "acl-other"])
    finally:
        backend_mod.use(previous)
    gone = q.enqueue("cancel me")
    assert q.cancel(gone.id)
    q.counts(), q.job_ids("pending"), q.job_ids("completed"), q.next_due_ms()
    list(q.events(since="$")), q.metrics(), q.configure_events(1000)  # observability
    q.read_events(count=10), q.last_event_id(), q.server_time_ms()
    q.pause()
    assert q.is_paused()
    q.resume()
    # group caps and rate limits (claim.lua's capped-group path: ZLEXCOUNT / ZRANGEBYLEX)
    q.groups.set_concurrency("tenant-a", 1)
    q.groups.set_rate_limit("tenant-b", 100, 1000)
    assert q.groups.concurrency("tenant-a") == 1
    assert q.groups.rate_limit("tenant-b") == (100, 1000)
    q.groups.counts("tenant-a"), q.groups.list()
    q.set_rate_limit(1000, 1000)
    assert q.rate_limit() == (1000, 1000)
    q.schedules.upsert("tick", every_ms=100, payload={"tick": 1})
    q.schedules.pump(), q.schedules.list(), q.schedules.get("tick")

    def handler(job):
        if job.payload == 2 and job.attempts == 1:
            raise RuntimeError("retry me")
        if job.payload == 3:
            job.progress({"half": True})
        return "ok"

    Worker(q, handler, lease_ms=1000, concurrency=2).run_until_idle(30, wait_scheduled=True)
    assert q.counts()["grouped"] == 0
    q.groups.set_concurrency("tenant-a", None)
    q.groups.clear_rate_limit("tenant-b")
    q.clear_rate_limit()
    doomed = q.enqueue("doomed", attempts=1)
    grouped_doomed = q.enqueue("doomed too", attempts=1, group="tenant-a")
    Worker(q, lambda job: 1 / 0, lease_ms=1000).run_until_idle(30)
    assert q.get(doomed.id).state == q.get(grouped_doomed.id).state == "failed"
    q.retry(doomed.id)
    q.retry(grouped_doomed.id)  # rejoins its lane: the ring join first
    w = Worker(q, lambda job: "ok", lease_ms=1000)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()  # run(): blocks on the wake marker (BZPOPMIN) between jobs
    wait_until(lambda: q.get(doomed.id).state == "completed", 20, "the retried job")
    wait_until(lambda: q.get(grouped_doomed.id).state == "completed", 20, "the grouped one")
    w.stop()
    t.join(20)
    q.trim(keep_completed=0, max_age_ms=0)
    q.trim(keep_completed=0, keep_failed=0, limit=10)
    q.promote(), q.reap()
    board = Leaderboard(conn, "acl-board")
    board.set_many({"ada": 3, "bob": 2})
    board.incr("bob", 5)
    assert [e.member for e in board.around("ada", 1)] == ["bob", "ada"]
    assert board.rank("ada") == 2 and len(board.top(5)) == 2
    board.clear()
    assert q.schedules.remove("tick")
    assert q.obliterate() > 0
    Queue("acl-other", conn).obliterate()
    conn.close()


@pytest.mark.parametrize("rules", [BROAD_ACL, MINIMAL_ACL], ids=["broad", "minimal"])
def test_acl_user_restricted_to_emq_keys_runs_everything(server_factory, rules):
    _, port, _ = server_factory("--user", "emquser", "on", ">emq-pw", "~emq:*",
                                "resetchannels", *rules)
    admin = redis.Redis(port=port)
    try:
        exercise_everything(f"redis://emquser:emq-pw@127.0.0.1:{port}/0")
    except redis.RedisError as exc:  # name what the ACL refused, for the next engineer
        denied = [(e.get("object"), e.get("context")) for e in admin.acl_log()]
        raise AssertionError(f"{exc!r}; ACL LOG denied: {denied}") from None
    # Nothing was refused along the way, except the worker's optional precise wake-up
    # (CLIENT ID / CLIENT UNBLOCK, see emqfast/wake.py) and CONFIG GET, which fall back.
    refused = {e.get("object") for e in admin.acl_log()}
    assert refused <= OPTIONAL_COMMANDS, refused
    # ...and the user really is restricted: no other keys, nothing dangerous
    user = redis.Redis.from_url(f"redis://emquser:emq-pw@127.0.0.1:{port}/0")
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.set("not-emq", 1)
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.flushall()
    with pytest.raises(redis.ResponseError):  # a script touching a key outside emq:*
        user.eval("return redis.call('GET', KEYS[1])", 1, "other:key")
    assert admin.keys("*") == []


# --- passwords never reach logs or exception messages ---------------------------------

SECRET = "s3cr3t-Pw-7f1c"


def all_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


def test_password_never_in_connect_errors_or_logs(caplog, backend):
    caplog.set_level(logging.DEBUG)
    dead = _free_port()
    url = f"redis://user:{SECRET}@127.0.0.1:{dead}/0"
    conn = emqfast.connect(url)
    assert SECRET not in repr(conn)
    q = Queue("nobody", conn)
    for call in (lambda: q.enqueue("x"), lambda: q.enqueue_many(["x", "y"]), q.counts):
        with pytest.raises(Exception) as info:  # whichever type: the point is the text
            call()
        assert SECRET not in all_text(info.value)
    for bad in (f"redis://user:{SECRET}@127.0.0.1:notaport/0",
                f"redis+cluster://user:{SECRET}@127.0.0.1:notaport",
                f"rediss://user:{SECRET}@[::1/0", f"nope://user:{SECRET}@host/0"):
        with pytest.raises(ConnectionFailed) as info:
            emqfast.connect(bad)
        assert SECRET not in all_text(info.value) and "***" in str(info.value)
    assert SECRET not in caplog.text
    assert all(SECRET not in r.getMessage() for r in caplog.records)


def test_wrong_password_error_does_not_echo_it(server_factory):
    _, port, _ = server_factory("--user", "emquser", "on", ">the-real-one", "~*", "+@all")
    q = Queue("auth", emqfast.connect(f"redis://emquser:{SECRET}@127.0.0.1:{port}/0"))
    with pytest.raises(Exception) as info:  # AuthenticationError, or its typed PermissionDenied
        q.enqueue("x")
    assert SECRET not in all_text(info.value) and "the-real-one" not in all_text(info.value)


def test_worker_reconnect_warnings_do_not_leak_the_password(server_factory, caplog, qname):
    caplog.set_level(logging.DEBUG)
    auth = ("--user", "emquser", "on", f">{SECRET}", "~emq:*", "+@all")
    proc, port, workdir = server_factory(*auth, "--appendonly", "yes", "--appendfsync", "always")
    url = f"redis://emquser:{SECRET}@127.0.0.1:{port}/0"
    q = Queue(qname, emqfast.connect(url, socket_timeout=2))
    first = q.enqueue("before")
    w = Worker(q, lambda job: job.payload, lease_ms=1000)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        wait_until(lambda: w.stats.completed == 1, 20, "the first job")
        proc.kill()
        proc.wait(10)
        # "redis unavailable ... retrying" or "claim failed ... re-sending": whichever call
        # the kill cut, a warning that names the fault (and must not name the password)
        wait_until(lambda: any(r.name.startswith("emqfast") and r.levelno >= logging.WARNING
                               for r in caplog.records), 20, "the worker's reconnect warning")
        server_factory(*auth, "--appendonly", "yes", "--appendfsync", "always",
                       port=port, workdir=workdir)
        second = q.enqueue("after")  # the worker reconnects by itself and carries on
        wait_until(lambda: w.stats.completed == 2, 30, "the job enqueued after the restart")
    finally:
        w.stop()
        t.join(20)
    assert q.get(first.id).state == q.get(second.id).state == "completed"
    assert SECRET not in caplog.text
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        if record.exc_info:
            assert SECRET not in "".join(traceback.format_exception(*record.exc_info))


# --- TLS through the redis-py path ------------------------------------------------------

@pytest.fixture(scope="module")
def tls_server():
    """A TLS-only redis-server (``--port 0``) with a throwaway CA, or skip without TLS."""
    exe, openssl = shutil.which("redis-server"), shutil.which("openssl")
    if not exe or not openssl:
        pytest.skip("needs redis-server and openssl")
    d = Path(tempfile.mkdtemp(prefix="emq-test-tls-"))

    def ssl(*args):
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=emqfast test CA")
    ssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf")
    port = _free_port()
    proc = subprocess.Popen(
        [exe, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(d), "--tls-cert-file", str(d / "server.crt"),
         "--tls-key-file", str(d / "server.key"), "--tls-ca-cert-file", str(d / "ca.crt"),
         "--tls-auth-clients", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    client = redis.Redis(port=port, ssl=True, ssl_ca_certs=str(d / "ca.crt"))

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                shutil.rmtree(d, ignore_errors=True)
                pytest.skip(f"redis-server has no TLS support here: {err[-300:]}")
            return False
    try:
        wait_until(answers, 10, "the TLS redis-server to answer PING", interval=0.05)
    except AssertionError:
        proc.kill()
        raise
    client.close()
    yield f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={d / 'ca.crt'}"
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(d, ignore_errors=True)


def test_tls_enqueue_and_worker_through_redis_py(tls_server, qname, backend, caplog):
    caplog.set_level(logging.INFO, logger="emqfast")
    backend_mod._refusals_logged.clear()
    conn = emqfast.connect(tls_server)
    assert issubclass(conn.connection_pool.connection_class, redis.SSLConnection)
    if backend == "c":  # the C Batcher speaks TLS too (more in tests/test_tls_c.py)
        backend_mod._native.Batcher.from_redis(conn).close()
    q = Queue(qname, conn)
    one = q.enqueue({"n": 0})
    many = q.enqueue_many([{"n": i} for i in range(1, 201)])  # under C: hiredis over TLS
    assert [q.get(ref.id).payload for ref in many[:3]] == [{"n": 1}, {"n": 2}, {"n": 3}]
    seen = []
    stats = Worker(q, lambda job: seen.append(job.payload["n"]) or "ok").run_until_idle(30)
    assert stats.completed == 201 and sorted(seen) == list(range(201))
    assert q.get(one.id).result == "ok"
    refusals = [r for r in caplog.records if "C batcher unavailable" in r.getMessage()]
    assert len(refusals) == 0  # nothing falls back to redis-py, C or not
    # a plain-text client cannot talk to the TLS-only server: the traffic really is TLS
    plain = redis.Redis(port=conn.connection_pool.connection_kwargs["port"], socket_timeout=0.5)
    with pytest.raises(redis.RedisError):
        plain.ping()
    conn.close()


# --- redaction does not depend on URL parsing -----------------------------------------

MALFORMED = [
    "default:Hunter2Secret@127.0.0.1:P",            # scheme missing
    "redis//:Hunter2Secret@127.0.0.1:6379",         # typo: no colon after the scheme
    "redis:/:Hunter2Secret@127.0.0.1:1/0",          # typo: one slash
    "redis:://u:Hunter2Secret@127.0.0.1:1",         # typo: doubled colon
    "redsi://u:Hunter2Secret@127.0.0.1:1/0",        # typo in the scheme
    ":Hunter2Secret@127.0.0.1:1",                   # password alone, no scheme
    "redis://u:Hunter2Secret@@127.0.0.1:1/0",       # doubled '@'
    "redis://:pre@Hunter2Secret@127.0.0.1:1/0",     # unencoded '@' in the password
    "redis://u:Hunter2/Secret@127.0.0.1:1/0",       # unencoded '/' in the password
    "redis://u:Hunt:er2Secret/x@127.0.0.1:1/0",     # ':' and '/' in the password
    "redis://127.0.0.1:1/0?password=Hunter2Secret",  # redis-py's query form
    "redis://127.0.0.1:1/0?db=0&PASSWORD=Hunter2Secret",
    "rediss://u:Hunter2Secret@[::1/0",              # broken IPv6 literal
    "redis+cluster://u:Hunter2Secret@127.0.0.1:notaport",
    "unix://:Hunter2Secret@/nonexistent/r.sock",
    "redis://u:Hunter2%40Secret@127.0.0.1:1/0",     # percent-encoded '@'
]
LEAKS = ("Hunter2Secret", "Hunter2", "er2Secret", "Hunter2@Secret")


def _leaked(text: str) -> list:
    return [piece for piece in LEAKS if piece in text]


def test_redact_masks_malformed_urls_in_any_text():
    from emqfast.core.redaction import redact, scrub
    for url in MALFORMED:
        line = f"cannot connect to '{url}' (attempt 3)"
        assert not _leaked(redact(line)), (url, redact(line))
        assert not _leaked(scrub(f"port {url.split(':')[-1]!r} is bad: {url}", [url]))
    assert redact("redis://user@h:1/0 and mail me at a@b.c") == \
        "redis://user@h:1/0 and mail me at a@b.c"  # no password: nothing to mask


@pytest.mark.parametrize("url", MALFORMED)
def test_connect_errors_never_echo_a_malformed_urls_password(url):
    try:
        client = emqfast.connect(url, socket_connect_timeout=0.5, socket_timeout=0.5)
    except ConnectionFailed as exc:
        assert not _leaked(all_text(exc)), all_text(exc)
        return
    with pytest.raises(Exception) as info:  # nothing listens where it points
        Queue("nobody", client).enqueue("x")
    assert not _leaked(all_text(info.value))


def _cli(monkeypatch, capsys, argv: list, env_url: str = "") -> str:
    from emqfast.tools import cli
    if env_url:
        monkeypatch.setenv("EMQ_REDIS_URL", env_url)
    else:
        monkeypatch.delenv("EMQ_REDIS_URL", raising=False)
    monkeypatch.setattr("sys.argv", ["emqfast", *argv])
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    out = capsys.readouterr()
    assert done.value.code != 0
    return out.out + out.err


@pytest.mark.parametrize("url", MALFORMED)
def test_cli_never_echoes_a_malformed_urls_password(url, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("EMQ_STATE_DIR", str(tmp_path))  # never the user's embedded server
    for argv, env_url in ((["--url", url, "stats"], ""), (["stats", "q"], url)):
        text = _cli(monkeypatch, capsys, argv, env_url)
        assert "error" in text and not _leaked(text), text


def test_a_missing_password_says_so_and_how_to_pass_one(server_factory, backend):
    """It names the missing password, not "HELLO must be called with the client already
    authenticated"."""
    _, port, _ = server_factory()
    redis.Redis(port=port).config_set("requirepass", SECRET)
    q = Queue("needs-auth", emqfast.connect(f"redis://127.0.0.1:{port}/0"))
    for call in (lambda: q.enqueue("x"), lambda: q.enqueue_many(["x", "y"]), q.counts):
        with pytest.raises(emqfast.errors.PermissionDenied) as info:
            call()
        text = str(info.value)
        assert "requires a password" in text and "HELLO" not in text, text
        assert "PASSWORD@HOST:PORT" in text
