"""``enqueue_many`` over TLS against plain TCP, in one run, on one redis-server that listens
on both (target: TLS >= 0.8x TCP under the C backend).

    python bench/tls.py [--n 50000] [--reps 5]      # or: python -m emqfast.bench.tls

Starts its own redis-server with a throwaway CA it makes with ``openssl`` (server and
client certificates), alternates TCP and TLS runs on fresh queues so drift on a shared
machine hits both, verifies every job landed, and prints the medians and their ratio.
The helpers that make the CA and start the server are reused by tests/test_tls_c.py.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import redis

TARGET = 0.80


def make_certs(where: Path) -> Dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate,
    all signed by that CA (EC P-256, valid two days), as PEM files in ``where``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is needed to make the test CA (scripts/system-deps.sh)")

    def ssl(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=where, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    # The extensions Python 3.13's default context (VERIFY_X509_STRICT) insists on.
    ssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=emqfast test CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-addext", "subjectKeyIdentifier=hash")
    leaf = ("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
    (where / "server.ext").write_text(leaf + "extendedKeyUsage=serverAuth\n"
                                      "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (where / "client.ext").write_text(leaf + "extendedKeyUsage=clientAuth\n")
    for name, subject in (("server", "/CN=127.0.0.1"), ("client", "/CN=emqfast client")):
        ssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        ssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    return {name: where / name for name in
            ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TlsServer:
    """A private redis-server listening on a plain port and a TLS port."""

    proc: subprocess.Popen
    workdir: Path
    port: int
    tls_port: int
    certs: Dict[str, Path]

    def url(self, tls: bool = True, host: str = "127.0.0.1", client_cert: bool = True,
            **query: str) -> str:
        """A ``rediss://`` URL with the CA (and the client certificate), or ``redis://``."""
        if not tls:
            return f"redis://{host}:{self.port}/0"
        params = {"ssl_ca_certs": str(self.certs["ca.crt"])}
        if client_cert:
            params.update(ssl_certfile=str(self.certs["client.crt"]),
                          ssl_keyfile=str(self.certs["client.key"]))
        params.update(query)
        return f"rediss://{host}:{self.tls_port}/0?" + "&".join(f"{k}={v}" for k, v in
                                                               params.items())

    def stop(self) -> None:
        """Stop the server and delete its directory (certificates included)."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_tls_server(auth_clients: str = "yes", binds: Sequence[str] = ("127.0.0.1",),
                     timeout_s: float = 15) -> TlsServer:
    """Start redis-server with TLS (``--tls-auth-clients auth_clients``) and plain TCP.
    Raises RuntimeError when redis-server or openssl is missing or has no TLS."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed")
    workdir = Path(tempfile.mkdtemp(prefix="emq-tls-"))
    certs = make_certs(workdir)
    port, tls_port = _free_port(), _free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--tls-port", str(tls_port), "--bind", *binds,
         "--save", "", "--appendonly", "no", "--dir", str(workdir),
         "--tls-cert-file", str(certs["server.crt"]), "--tls-key-file", str(certs["server.key"]),
         "--tls-ca-cert-file", str(certs["ca.crt"]), "--tls-auth-clients", auth_clients],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    server = TlsServer(proc, workdir, port, tls_port, certs)
    client = redis.Redis(port=port, socket_timeout=1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr and proc.poll() is not None else ""
                server.stop()
                raise RuntimeError(f"redis-server with TLS did not start: {err[-300:]}")
            time.sleep(0.05)
    client.close()
    return server


def enqueue_rate(url: str, payloads: List[bytes]) -> float:
    """jobs/s of one ``enqueue_many`` on a fresh queue at ``url``, every job verified."""
    import emqfast
    from emqfast.core.keys import QueueKeys

    conn = emqfast.connect(url)
    name = f"bench-tls-{uuid.uuid4().hex[:8]}"
    try:
        q = emqfast.Queue(name, conn)
        q.enqueue_many(payloads[:10])  # warm: scripts loaded, the connection open
        start = time.perf_counter()
        refs = q.enqueue_many(payloads)
        seconds = time.perf_counter() - start
        pending = conn.zcard(QueueKeys(name).pending)
        if len(refs) != len(payloads) or pending != len(payloads) + 10:
            raise AssertionError(f"{url.split('?')[0]}: {pending} jobs pending, "
                                 f"not {len(payloads) + 10}")
        return len(payloads) / seconds
    finally:
        conn.delete(*conn.keys(f"emq:{{{name}}}:*") or ["-"])
        conn.close()


def c_path(url: str) -> bool:
    """Whether bulk calls at ``url`` go through the C batcher (not redis-py)."""
    import emqfast
    from emqfast.backends import select

    conn = emqfast.connect(url)
    try:
        return isinstance(select.batcher_for(conn), select.SharedBatcher)
    finally:
        conn.close()


def measure(server: TlsServer, n: int, reps: int) -> Dict[str, float]:
    """Median jobs/s over TCP and over TLS (alternated) and their ratio."""
    payloads = [b"x" * 100 for _ in range(n)]
    tcp: List[float] = []
    tls: List[float] = []
    for _ in range(reps):
        tcp.append(enqueue_rate(server.url(tls=False), payloads))
        tls.append(enqueue_rate(server.url(tls=True), payloads))
    tcp_s, tls_s = statistics.median(tcp), statistics.median(tls)
    return {"tcp_jobs_s": tcp_s, "tls_jobs_s": tls_s, "ratio": tls_s / tcp_s}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print TCP and TLS enqueue_many rates and their ratio; 1 if under the target."""
    import emqfast

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50_000, help="jobs per enqueue_many")
    parser.add_argument("--reps", type=int, default=5, help="runs per transport (median)")
    args = parser.parse_args(argv)
    server = start_tls_server()
    try:
        got = measure(server, args.n, args.reps)
        via_c = c_path(server.url(tls=True))
    finally:
        server.stop()
    ok = got["ratio"] >= TARGET
    print(f"enqueue_many x{args.n} ({emqfast.backend()} backend, TLS through the "
          f"{'C batcher' if via_c else 'redis-py fallback'}), median of {args.reps}: "
          f"TCP {got['tcp_jobs_s']:,.0f} jobs/s, TLS {got['tls_jobs_s']:,.0f} jobs/s, "
          f"TLS/TCP {got['ratio']:.2f} (target >= {TARGET}: {'ok' if ok else 'MISSED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
