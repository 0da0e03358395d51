"""TLS on the C path: ``rediss://`` bulk calls run on the C Batcher (hiredis'
ssl.c, compiled into the core) instead of falling back to redis-py, with the settings
redis-py takes (CA file, client certificate and key, verification, host name check),
and land exactly what the Python path lands.

One private redis-server listens on TLS (client certificates required) and plain TCP,
on 127.0.0.1 and 127.0.0.2, with a CA this module makes (bench/tls.py's helpers)."""
from __future__ import annotations

import hashlib
import importlib
import os
import sys

import pytest
import redis

import emqfast
from conftest import require_native
from emqfast.core.errors import BackendUnavailable, CertificateRejected, ConnectionFailed

pytestmark = pytest.mark.timeout(90)  # a TLS read that waits for nothing fails, not hangs

backend_mod = importlib.import_module("emqfast.backend")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INCR = "return redis.call('INCR', KEYS[1])"
INCR_SHA = hashlib.sha1(INCR.encode()).hexdigest()


def _tls_bench():
    try:
        return importlib.import_module("emqfast.bench.tls")
    except ModuleNotFoundError:
        sys.path.insert(0, ROOT)
        return importlib.import_module("bench.tls")


@pytest.fixture(scope="module")
def native():
    """The C backend module, with TLS compiled in (a build without it fails under CI)."""
    require_native()
    from emqfast.backends import native_tls

    if not native_tls.built():
        message = "the C core was built without TLS (no OpenSSL headers at build time)"
        if os.environ.get("EMQ_REQUIRE_C") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return backend_mod._native


def serving():
    """The TLS test server for a fixture to yield (the test skipped when none can start)."""
    try:
        server = _tls_bench().start_tls_server(binds=("127.0.0.1", "127.0.0.2"))
    except RuntimeError as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_srv(native):
    yield from serving()


@pytest.fixture
def c_backend(native):
    previous = emqfast.backend()
    backend_mod.use("c")
    yield
    backend_mod.use(previous)


def _client(server, **options) -> redis.Redis:
    """A redis-py TLS client of ``server`` (CA + client certificate unless overridden)."""
    kw = dict(host="127.0.0.1", port=server.tls_port, ssl=True,
              ssl_ca_certs=str(server.certs["ca.crt"]),
              ssl_certfile=str(server.certs["client.crt"]),
              ssl_keyfile=str(server.certs["client.key"]))
    kw.update(options)
    return redis.Redis(**{k: v for k, v in kw.items() if v is not None})


def _incr_three(native, client: redis.Redis, key: str) -> list:
    with native.Batcher.from_redis(client) as b:
        return b.evalsha_many(INCR_SHA, INCR.encode(), 1, [[key]] * 3)


def _c_clients_on_tls_port(admin: redis.Redis, server, besides: int) -> list:
    """Server-side view: clients on the TLS port other than redis-py's (``besides``)
    whose last command was EVALSHA, i.e. the C Batcher's connections."""
    return [c for c in admin.client_list()
            if c["laddr"].endswith(f":{server.tls_port}") and int(c["id"]) != besides
            and c["cmd"] == "evalsha"]


def _snapshot(conn: redis.Redis, q: emqfast.Queue) -> tuple:
    """What enqueue_many wrote: pending ids and scores, and every job hash but its
    creation time."""
    pending = conn.zrange(q.keys.pending, 0, -1, withscores=True)
    jobs = []
    for job_id, _ in pending:
        fields = conn.hgetall(q.keys.job(job_id.decode()))
        fields.pop(b"created", None)
        jobs.append(sorted(fields.items()))
    return pending, jobs


def test_enqueue_many_over_tls_runs_on_the_c_path_and_matches_python(tls_srv, qname,
                                                                       c_backend, caplog):
    caplog.set_level("INFO", logger="emqfast")
    payloads = [{"n": i, "pad": "x" * (i % 50)} for i in range(3000)]
    ids = [f"JOBtls{i}" for i in range(3000)]
    conn = emqfast.connect(tls_srv.url(tls=True))
    admin = redis.Redis(port=tls_srv.port)
    handle = backend_mod.batcher_for(conn)
    assert isinstance(handle, backend_mod.SharedBatcher)  # chosen: the C batcher, TLS on
    q_c = emqfast.Queue(f"{qname}-c", conn)
    refs_c = q_c.enqueue_many(payloads, job_ids=ids, priority=3)
    # It really ran there: the thread's C connection is open over TLS, and the server
    # saw EVALSHA on the TLS port from a connection that is not redis-py's.
    native_batcher = handle.batcher()
    assert native_batcher._tls is not None and native_batcher._pid == os.getpid()
    assert _c_clients_on_tls_port(admin, tls_srv, besides=conn.client_id())
    assert not [r for r in caplog.records if "C batcher unavailable" in r.getMessage()]

    backend_mod.use("python")
    q_py = emqfast.Queue(f"{qname}-p", conn)
    refs_py = q_py.enqueue_many(payloads, job_ids=ids, priority=3)
    assert [(r.id, r.status) for r in refs_c] == [(r.id, r.status) for r in refs_py]
    assert len(refs_c) == 3000
    assert _snapshot(conn, q_c) == _snapshot(conn, q_py)
    backend_mod.close_shared()
    conn.close()


def test_client_certificate_and_ca_are_used(tls_srv, native):
    assert _incr_three(native, _client(tls_srv), "cert") == [1, 2, 3]
    # the server requires a client certificate: its alert, or a handshake it cut
    with pytest.raises((CertificateRejected, ConnectionFailed)):
        _incr_three(native, _client(tls_srv, ssl_certfile=None, ssl_keyfile=None), "cert")
    with pytest.raises(CertificateRejected, match="certificate verify failed"):
        # a CA that did not sign the server's certificate
        _incr_three(native, _client(tls_srv, ssl_ca_certs=str(tls_srv.certs["client.crt"])),
                    "cert")
    # verification off: no CA needed
    assert _incr_three(native, _client(tls_srv, ssl_ca_certs=None, ssl_cert_reqs="none"),
                       "cert") == [4, 5, 6]


def test_host_name_is_checked_unless_told_not_to(tls_srv, native):
    assert _incr_three(native, _client(tls_srv, host="localhost"), "host") == [1, 2, 3]
    other = _client(tls_srv, host="127.0.0.2")  # the certificate names 127.0.0.1 only
    with pytest.raises(CertificateRejected, match="certificate verify failed"):
        _incr_three(native, other, "host")
    assert _incr_three(native, _client(tls_srv, host="127.0.0.2", ssl_check_hostname=False),
                       "host") == [4, 5, 6]


def test_a_tls_connection_is_reused_and_replaced_when_dropped(tls_srv, native):
    admin = redis.Redis(port=tls_srv.port)
    with native.Batcher.from_redis(_client(tls_srv)) as b:
        assert b.evalsha_many(INCR_SHA, INCR.encode(), 1, [["reuse"]]) == [1]
        before = admin.info("stats")["total_connections_received"]
        # idle and usable (session tickets read, no reconnect), then dropped and replaced
        assert b.evalsha_many(INCR_SHA, INCR.encode(), 1, [["reuse"]] * 2000)[-1] == 2001
        assert admin.info("stats")["total_connections_received"] == before
        admin.client_kill_filter(_type="normal", skipme=True)
        assert b.evalsha_many(INCR_SHA, INCR.encode(), 1, [["reuse"]]) == [2002]
        assert admin.info("stats")["total_connections_received"] == before + 1


def test_tls_settings_the_c_path_cannot_honour_fall_back(tls_srv, native, qname, c_backend):
    pem = tls_srv.certs["ca.crt"].read_text()
    client = _client(tls_srv, ssl_ca_certs=None, ssl_ca_data=pem)
    with pytest.raises(BackendUnavailable, match="ssl_ca_data"):
        native.Batcher.from_redis(client)
    q = emqfast.Queue(qname, client)  # redis-py carries it, same result
    assert len(q.enqueue_many([{"n": i} for i in range(50)])) == 50
    assert client.zcard(q.keys.pending) == 50


def test_the_tls_bench_measures_both_transports(tls_srv, c_backend):
    got = _tls_bench().measure(tls_srv, n=300, reps=1)  # a smoke run: no timing asserted
    assert got["tcp_jobs_s"] > 0 and got["tls_jobs_s"] > 0
    backend_mod.close_shared()
