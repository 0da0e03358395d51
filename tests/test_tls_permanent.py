"""A TLS certificate failure is permanent, told the same from every path.

A wrong CA, or a server certificate naming another host (an expired one fails the same
check: ``certificate verify failed``), is ``CertificateRejected`` (a
``PermissionDenied``) from a single command, a pipeline, a script through either
Batcher, pub/sub (``ref.wait``), and the thread and asyncio Workers raise it instead of
retrying for ever as if the network were down. A handshake the network cut stays a
``ConnectionFailed`` (transient)."""
from __future__ import annotations

import asyncio
import importlib
import ssl

import pytest
import redis

import emqfast
import emqfast.aio
from conftest import native_built
from engine_util import raised
from emqfast.core.errors import (CertificateRejected, ConnectionFailed, PermissionDenied,
                                 is_transient, translate)

pytestmark = pytest.mark.timeout(120)

backend_mod = importlib.import_module("emqfast.backend")


@pytest.fixture(scope="module")
def tls_srv():
    from test_tls_c import serving  # its server, without its need of the C core
    yield from serving()


@pytest.fixture(params=["c", "python"])
def backend(request):
    if request.param == "c" and not native_built():
        pytest.skip("C core not built")
    previous = backend_mod.current()
    backend_mod.use(request.param)
    yield request.param
    backend_mod.close_shared()
    backend_mod.use(previous)


def _url(server, case: str) -> str:
    """A ``rediss://`` URL of ``server`` whose certificate check fails as ``case`` says."""
    if case == "wrong CA":  # a CA that did not sign the server's certificate
        return server.url(ssl_ca_certs=str(server.certs["client.crt"]))
    return server.url(host="127.0.0.2")  # misnamed: the certificate names 127.0.0.1 only


CASES = ["wrong CA", "misnamed"]


@pytest.mark.parametrize("case", CASES)
def test_every_path_raises_the_certificate_failure(tls_srv, backend, qname, case):
    q = emqfast.Queue(qname, emqfast.connect(_url(tls_srv, case)))
    ref = q.ref("JOB" + "1" * 23)
    got = {"script": raised(lambda: q.enqueue("x")),
           "batch": raised(lambda: q.enqueue_many(["x", "y"])),
           "pipeline": raised(lambda: q.get(ref.id)),
           "command": raised(q.pause),
           "pub/sub": raised(lambda: ref.wait(timeout_s=5))}
    wrong = {k: (type(v).__name__, str(v)[:160]) for k, v in got.items()
             if not isinstance(v, CertificateRejected)}
    assert not wrong, wrong
    assert all(isinstance(v, PermissionDenied) and not is_transient(v)
               for v in got.values())


@pytest.mark.parametrize("case", CASES)
def test_the_thread_worker_raises_it_instead_of_retrying(tls_srv, backend, qname, case):
    q = emqfast.Queue(qname, emqfast.connect(_url(tls_srv, case)))
    with pytest.raises(CertificateRejected, match="certificate"):
        emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=60)


@pytest.mark.parametrize("case", CASES)
def test_the_asyncio_worker_raises_it_instead_of_retrying(tls_srv, qname, case):
    async def main() -> None:
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(_url(tls_srv, case)))
        await emqfast.aio.Worker(q, lambda job: None).run_until_idle(timeout_s=60)
    with pytest.raises(CertificateRejected, match="certificate"):
        asyncio.run(main())


def test_a_handshake_cut_by_the_network_stays_transient():
    cut = redis.ConnectionError("Error 8 while writing to socket. EOF occurred in "
                                "violation of protocol (_ssl.c:2427).")
    cut.__cause__ = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    assert isinstance(translate(cut), ConnectionFailed) and is_transient(cut)
    verify = redis.ConnectionError("Error 1 connecting to h:1. [SSL: CERTIFICATE_VERIFY_FAILED]"
                                   " certificate verify failed: certificate has expired")
    assert isinstance(translate(verify), CertificateRejected)
