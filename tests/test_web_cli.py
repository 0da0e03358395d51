"""``emqfast dashboard`` serves the app and prints its address; a host others can
reach is refused without an auth token, with a typed error that says why."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("uvicorn")
import httpx  # noqa: E402

from emqfast.tools.cli_dashboard import (ExposedWithoutAuth, check_exposure,  # noqa: E402
                                         is_loopback)
from waiting import wait_until  # noqa: E402


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.0.0.9", True),
                                            ("::1", True), ("[::1]", True),
                                            ("localhost", True), ("0.0.0.0", False),
                                            ("::", False), ("10.0.0.5", False),
                                            ("example.com", False)])
def test_which_hosts_are_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_an_exposed_host_needs_a_token():
    with pytest.raises(ExposedWithoutAuth, match="other machines could reach it.*--auth-token"):
        check_exposure("0.0.0.0", None)
    check_exposure("0.0.0.0", "a-long-token")
    check_exposure("127.0.0.1", None)
    assert issubclass(ExposedWithoutAuth, Exception)


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "emqfast", *args], capture_output=True,
                          text=True, timeout=60, **kw)


def test_the_cli_refuses_an_exposed_host_in_one_line(redis_url):
    got = _cli("dashboard", "--url", redis_url, "--host", "0.0.0.0", "--port", "0",
               env={**os.environ, "COLUMNS": "200"})
    assert got.returncode == 1
    assert "ExposedWithoutAuth" in got.stderr and "--auth-token" in got.stderr


def test_the_cli_serves_the_dashboard_and_prints_its_address(redis_url, qname):
    import emqfast

    emqfast.Queue(qname, emqfast.connect(redis_url)).enqueue({"n": 1})
    proc = subprocess.Popen([sys.executable, "-m", "emqfast", "dashboard", "--url", redis_url,
                             "--port", "0", "--read-only"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+/) \(Redis: ([^)]*)\)", line)
        assert found, line
        url = found.group(1)

        def overview():
            try:
                return httpx.get(url, timeout=5)
            except httpx.HTTPError:
                return None
        page = wait_until(overview, what="the dashboard to answer")
        assert page.status_code == 200 and qname in page.text and "read-only" in page.text
    finally:
        proc.terminate()
        proc.wait(20)
