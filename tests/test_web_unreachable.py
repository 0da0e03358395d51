"""The dashboard against a Redis server it cannot use (down, or a wrong password): at
start it says so in one line and serves anyway; each page answers 502 with the reason;
each failure is one log line (a traceback only with ``-v`` / debug logging)."""
from __future__ import annotations

import logging
import re
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("uvicorn")
import httpx  # noqa: E402
import redis  # noqa: E402

from emqfast.web import create_app  # noqa: E402
from emqfast.web.app import check_server  # noqa: E402
from conftest import start_redis_server  # noqa: E402
from waiting import wait_until  # noqa: E402
from web_client import TestClient  # noqa: E402

PASSWORD = "Sup3r-Secret-Pw-4711"


def dead_url() -> str:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def serve(*args):
    """``emqfast [args] dashboard --port 0``: the process and the URL it prints."""
    proc = subprocess.Popen([sys.executable, "-m", "emqfast", *args, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    found = re.search(r"on (http://127\.0\.0\.1:\d+/)", line)
    assert found, line + proc.stderr.read()
    return proc, found.group(1)


def _get(url):
    try:
        return httpx.get(url, timeout=5)
    except httpx.HTTPError:
        return None


def pages_then_stop(proc, url, paths=("", "queue?q=x", "workers")) -> str:
    """GET each path (expecting 502), stop the server: what it wrote to stderr."""
    try:
        wait_until(lambda: _get(url), what="the dashboard to answer")
        for path in paths:
            got = httpx.get(url + path, timeout=10)
            assert got.status_code == 502, (path, got.status_code)
            assert "502 · Redis did not answer" in got.text
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    return err


def test_a_dead_server_is_named_at_start_and_logged_in_one_line_per_request():
    url = dead_url()
    proc, address = serve("dashboard", "--url", url)
    err = pages_then_stop(proc, address)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert "cannot reach the Redis server at 127.0.0.1" in lines[0], lines
    assert "Serving anyway" in lines[0]
    failed = [ln for ln in lines if "answered 502" in ln]
    assert len(failed) == 4, lines  # the first GET (waiting for it to answer) and 3 pages
    assert len(lines) <= 6, lines  # one line each, nothing else but shutdown notes


def test_a_wrong_password_is_named_at_start_and_never_shown():
    proc_redis, port, _ = start_redis_server()
    try:
        redis.Redis(port=port).config_set("requirepass", PASSWORD)
        proc, address = serve("dashboard", "--url", f"redis://:wrong-{PASSWORD}@127.0.0.1:{port}/0")
        page = None
        try:
            page = wait_until(lambda: _get(address), what="the dashboard to answer")
        finally:
            err = pages_then_stop(proc, address, paths=("",))
        assert "wrong user name or password" in page.text and PASSWORD not in page.text
        first = err.splitlines()[0]
        assert "wrong user name or password" in first and "Serving anyway" in first, err
        assert PASSWORD not in err and "Traceback" not in err
    finally:
        proc_redis.terminate()
        proc_redis.wait(10)


def test_verbose_adds_the_tracebacks():
    proc, address = serve("-v", "dashboard", "--url", dead_url())
    err = pages_then_stop(proc, address, paths=("",))
    assert "Traceback" in err and "answered 502" in err


def test_each_failed_request_is_one_log_record(caplog):
    caplog.set_level(logging.INFO, logger="emqfast.web")
    with TestClient(create_app(dead_url())) as c:
        for path in ("/", "/queue?q=x", "/api/overview"):
            assert c.get(path).status_code == 502
    records = [r for r in caplog.records if r.name == "emqfast.web"]
    assert len(records) == 3, [r.getMessage() for r in records]
    assert all(not r.exc_info and "\n" not in r.getMessage() for r in records)
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="emqfast.web")
    with TestClient(create_app(dead_url())) as c:
        c.get("/")
    assert [bool(r.exc_info) for r in caplog.records if r.name == "emqfast.web"] == [True]


def test_a_silent_server_does_not_hold_up_the_start():
    class Silent:  # a host that drops packets: the connect hangs
        def ping(self):
            time.sleep(10)
    started = time.monotonic()
    said = check_server(Silent(), timeout_s=0.2)
    assert "did not answer within 0.2 s" in said
    assert time.monotonic() - started < 2
