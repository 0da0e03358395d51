"""Hostile hosts against the dashboard and the metrics server, over HTTP (Starlette's
TestClient; the metrics server and the CLI as real processes): a foreign ``Host`` (DNS
rebinding) gets nothing, a planted CSRF cookie or a cross-site POST changes nothing,
tokens must be strong and guessing them is throttled, logins are sessions a logout
revokes, nothing about the server shows before login, the leaderboards page does not
SCAN per request, every response carries the page headers, and any id downloads."""
from __future__ import annotations

import http.client
import re
import subprocess
import sys

import pytest
import redis

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from emqfast import Leaderboard, Queue  # noqa: E402
from emqfast.core.errors import InvalidInput  # noqa: E402
from emqfast.tools.hosts import AllowedHosts, host_name  # noqa: E402
from emqfast.web import create_app, security  # noqa: E402
from conftest import start_redis_server  # noqa: E402
from test_cli import cli_env  # noqa: E402
from waiting import wait_until  # noqa: E402
from web_client import TestClient  # noqa: E402

TOKEN = "Strong-token-9f3Kq2xZ"
EVIL = {"Host": "evil.example"}


def _pause_form(c: TestClient, qname: str, csrf=None) -> dict:
    return {"q": qname, "action": "pause", "csrf": csrf or c.cookies.get("emq_csrf")}


# --- 1. DNS rebinding: the Host allow-list -------------------------------------------------

def test_a_foreign_host_gets_nothing_and_changes_nothing(redis_url, conn, qname):
    q = Queue(qname, conn)
    q.enqueue({"secret": "payload"})
    with TestClient(create_app(redis_url)) as c:
        assert c.get("/").status_code == 200  # on 127.0.0.1: served
        for path in ("/", "/api/overview", f"/queue?q={qname}", "/static/app.css", "/login"):
            got = c.get(path, headers=EVIL)
            assert got.status_code == 421 and qname not in got.text, path
            assert got.headers["x-frame-options"] == "DENY"
        c.get("/")  # the CSRF cookie and token of a real page
        posted = c.post("/queue/action", data=_pause_form(c, qname), headers=EVIL)
        assert posted.status_code == 421
    assert not q.is_paused()


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8270", "localhost", "LOCALHOST:1",
                                  "[::1]:8270", "localhost."])
def test_loopback_hosts_are_served(redis_url, host):
    with TestClient(create_app(redis_url)) as c:
        assert c.get("/api/overview", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "127.0.0.1.evil.example", "", "10.0.0.5",
                                  "evil.example:8270", "[::1", "a@127.0.0.1", "::1"])
def test_other_hosts_are_refused(redis_url, host):
    with TestClient(create_app(redis_url)) as c:
        assert c.get("/api/overview", headers={"Host": host}).status_code in (400, 421)


def test_allowed_hosts_add_names_and_star_allows_any(redis_url):
    with TestClient(create_app(redis_url, allowed_hosts=["dash.example.com"])) as c:
        assert c.get("/api/overview", headers={"Host": "dash.example.com:443"}).status_code == 200
        assert c.get("/api/overview", headers=EVIL).status_code == 421
    with TestClient(create_app(redis_url, allowed_hosts=["*"])) as c:
        assert c.get("/api/overview", headers=EVIL).status_code == 200


def test_host_names_are_parsed_strictly():
    assert host_name("[::1]:80") == "::1" and host_name("Example.COM:8080") == "example.com"
    assert host_name("a b") is None and host_name("x/y") is None and host_name(None) is None
    hosts = AllowedHosts("dash.example")  # one name, not its letters
    assert hosts.allows("dash.example") and not hosts.allows("d")


def test_a_server_bound_to_every_interface_answers_this_machines_names():
    import socket

    from emqfast.tools.hosts import bound_names

    assert bound_names("10.1.2.3") == {"10.1.2.3"} and bound_names("[::1]") == {"::1"}
    everywhere = bound_names("0.0.0.0")
    assert socket.gethostname().lower() in everywhere and bound_names("::") == everywhere
    assert "evil.example" not in everywhere


# --- 1. CSRF bound to the server's secret, and cross-site checks ----------------------------

def test_a_planted_csrf_cookie_is_worth_nothing(redis_url, conn, qname):
    """Cookies ignore ports: a page on another port of this host can set emq_csrf and
    post the same value. The token must be one the dashboard signed."""
    q = Queue(qname, conn)
    q.enqueue({"n": 1})
    with TestClient(create_app(redis_url)) as c:
        c.cookies.set("emq_csrf", "planted-by-another-port", domain="127.0.0.1")
        got = c.post("/queue/action", data=_pause_form(c, qname, "planted-by-another-port"))
        assert got.status_code == 403
        assert not q.is_paused()
        c.cookies.clear()
        page = c.get(f"/queue?q={qname}", headers={"Cookie": "emq_csrf=planted-by-another-port"})
        token = re.search(r"emq_csrf=([^;]+)", page.headers["set-cookie"]).group(1)
        assert token != "planted-by-another-port" and f'value="{token}"' in page.text
        c.cookies.clear()
        got = c.post("/queue/action", data=_pause_form(c, qname, token),
                     headers={"Cookie": f"emq_csrf={token}"})
        assert got.status_code == 200  # the replaced, signed token works
    assert q.is_paused()


@pytest.mark.parametrize("headers", [
    {"Origin": "http://127.0.0.1:9999"}, {"Origin": "http://evil.example"},
    {"Origin": "null"}, {"Sec-Fetch-Site": "same-site"}, {"Sec-Fetch-Site": "cross-site"},
    {"Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-site"}])
def test_a_cross_site_post_is_refused_even_with_a_valid_token(redis_url, conn, qname, headers):
    q = Queue(qname, conn)
    q.enqueue({"n": 1})
    with TestClient(create_app(redis_url)) as c:
        c.get("/")
        got = c.post("/queue/action", data=_pause_form(c, qname), headers=headers)
        assert got.status_code == 403 and "another" in got.text
    assert not q.is_paused()


def test_a_same_origin_post_passes(redis_url, conn, qname):
    q = Queue(qname, conn)
    q.enqueue({"n": 1})
    with TestClient(create_app(redis_url)) as c:
        c.get("/")
        got = c.post("/queue/action", data=_pause_form(c, qname),
                     headers={"Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-origin"})
        assert got.status_code == 200
    assert q.is_paused()


def test_the_metrics_server_answers_its_own_hosts_only(redis_url, qname, conn):
    Queue(qname, conn).enqueue({"n": 1})
    proc = subprocess.Popen([sys.executable, "-m", "emqfast", "--url", redis_url, "metrics",
                             qname, "--serve", "0"], env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        port = int(re.search(r"127\.0\.0\.1:(\d+)/metrics", line).group(1))

        def get(host: str):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/metrics", headers={"Host": host})
            resp = c.getresponse()
            body = resp.read().decode()
            c.close()
            return resp.status, body

        status, body = get(f"127.0.0.1:{port}")
        assert status == 200 and qname in body
        status, body = get(f"evil.example:{port}")
        assert status == 421 and qname not in body
        assert get(f"localhost:{port}")[0] == 200
    finally:
        proc.terminate()
        proc.wait(20)


# --- 6. tokens: strength, from a file, throttled guessing ----------------------------------

@pytest.mark.parametrize("weak", ["short-Tok3n", "a" * 32, "0123012301230123",
                                  "abcdefghabcdefgh", "1234567890123456"])
def test_weak_tokens_are_refused(weak):
    with pytest.raises(InvalidInput, match="auth token"):
        create_app("redis://127.0.0.1:1/0", auth=weak)


def test_a_strong_token_is_accepted():
    create_app("redis://127.0.0.1:1/0", auth="x7Kp2mQ9vR4sLw8n")
    create_app("redis://127.0.0.1:1/0", auth="c2f0e8a1b7d94e6f")  # 16 hex digits


def test_the_token_can_come_from_a_file(tmp_path):
    from emqfast.tools.cli_dashboard import pick_token

    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    assert pick_token(None, str(path)) == TOKEN
    with pytest.raises(InvalidInput, match="not both"):
        pick_token(TOKEN, str(path))
    with pytest.raises(InvalidInput, match="cannot read"):
        pick_token(None, str(tmp_path / "missing"))


def test_guessing_the_token_is_throttled_per_client(redis_url):
    with TestClient(create_app(redis_url, auth=TOKEN)) as c:
        for _ in range(security.MAX_FAILURES):
            assert c.get("/api/overview", headers={"Authorization": "Bearer guess"}
                         ).status_code == 401
        right = c.get("/api/overview", headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 429 and int(right.headers["retry-after"]) > 0
    with TestClient(create_app(redis_url, auth=TOKEN)) as c:
        c.get("/login")
        for _ in range(security.MAX_FAILURES):
            wrong = c.post("/login", data={"csrf": c.cookies.get("emq_csrf"), "token": "no"})
            assert wrong.status_code == 401
        right = c.post("/login", data={"csrf": c.cookies.get("emq_csrf"), "token": TOKEN})
        assert right.status_code == 429 and "emq_auth" not in c.cookies


def test_the_throttle_counts_each_client_apart():
    throttle = security.Throttle(limit=3, window_s=60)
    for _ in range(3):
        assert not throttle.blocked("10.0.0.1")
        throttle.failed("10.0.0.1")
    assert 0 < throttle.blocked("10.0.0.1") <= 60
    assert throttle.blocked("10.0.0.2") == 0
    passed = security.Throttle(limit=1, window_s=0.0)
    passed.failed("10.0.0.1")
    assert passed.blocked("10.0.0.1") == 0  # its window is over: it may try again


# --- 7. sessions -----------------------------------------------------------------------------

def _login(c: TestClient) -> str:
    c.get("/login")
    assert c.post("/login", data={"csrf": c.cookies.get("emq_csrf"), "token": TOKEN}
                  ).status_code == 200
    return c.cookies.get("emq_auth")


def test_each_login_is_a_new_session_and_logout_revokes_it(redis_url):
    with TestClient(create_app(redis_url, auth=TOKEN)) as c:
        first = _login(c)
        c.cookies.clear()
        second = _login(c)
        assert first != second and TOKEN not in first
        c.post("/logout", data={"csrf": c.cookies.get("emq_csrf")})
        c.cookies.set("emq_auth", second)  # a copy of the cookie, replayed after logout
        assert c.get("/api/overview").status_code == 401
        c.cookies.set("emq_auth", first)  # the other session still holds
        assert c.get("/api/overview").status_code == 200


def test_a_session_expires(redis_url, monkeypatch):
    monkeypatch.setattr(security, "SESSION_TTL_S", -1.0)  # expired as soon as made
    with TestClient(create_app(redis_url, auth=TOKEN)) as c:
        _login(c)
        assert c.get("/api/overview").status_code == 401


# --- 8. nothing about the server before login ------------------------------------------------

def test_pages_before_login_show_nothing_about_the_server(redis_url):
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    with TestClient(create_app(redis_url, auth=TOKEN)) as c:
        for got in (c.get("/login"), c.get("/api/overview"), c.get("/", follow_redirects=True),
                    c.post("/job/action", data={}), c.get("/nope")):
            assert port not in got.text and "127.0.0.1" not in got.text, got.text
        _login(c)
        assert port in c.get("/").text  # signed in: where it reads is shown


# --- 9. leaderboards: one SCAN per interval, not per request ---------------------------------

def test_the_leaderboards_page_does_not_scan_per_request():
    proc, port, _ = start_redis_server()
    try:
        client = redis.Redis(port=port)
        Leaderboard(client, "scores").set("ada", 10)
        client.config_resetstat()
        with TestClient(create_app(f"redis://127.0.0.1:{port}/0")) as c:
            for _ in range(20):
                page = c.get("/leaderboards")
                assert page.status_code == 200 and "ada" in page.text
        scans = client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0)
        assert 1 <= scans <= 4, scans  # the first page's scan (and a background refresh)
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)


# --- 10. headers everywhere, downloads of any id ---------------------------------------------

def test_static_files_and_404s_carry_the_page_headers(redis_url):
    with TestClient(create_app(redis_url)) as c:
        for got in (c.get("/static/app.css"), c.get("/static/nope.js"), c.get("/nope"),
                    c.post("/")):
            assert "default-src 'none'" in got.headers["content-security-policy"], got
            assert got.headers["x-content-type-options"] == "nosniff"
            assert got.headers["x-frame-options"] == "DENY"


def test_a_payload_of_a_non_latin1_id_downloads(redis_url, conn, qname):
    q = Queue(qname, conn)
    q.enqueue({"n": 1}, job_id="JOB你好")
    with TestClient(create_app(redis_url)) as c:
        got = c.get("/job/payload", params={"q": qname, "id": "JOB你好"})
        assert got.status_code == 200 and got.json() == {"n": 1}
        disposition = got.headers["content-disposition"]
        assert "filename*=UTF-8''JOB%E4%BD%A0%E5%A5%BD.json" in disposition
        assert 'filename="JOB__.json"' in disposition


def test_the_cli_answers_the_allowed_host_it_is_given(redis_url, conn, qname):
    import httpx

    Queue(qname, conn).enqueue({"n": 1})
    proc = subprocess.Popen([sys.executable, "-m", "emqfast", "dashboard", "--url", redis_url,
                             "--port", "0", "--read-only", "--allowed-host", "dash.example"],
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        url = re.search(r"on (http://127\.0\.0\.1:\d+/)", proc.stdout.readline()).group(1)

        def overview(host: str):
            try:
                return httpx.get(url + "api/overview", headers={"Host": host}, timeout=5)
            except httpx.HTTPError:
                return None
        assert wait_until(lambda: overview("127.0.0.1"), what="the dashboard").status_code == 200
        assert overview("dash.example").status_code == 200
        refused = overview("evil.example")
        assert refused.status_code == 421 and qname not in refused.text
    finally:
        proc.terminate()
        proc.wait(20)


def test_the_cli_reads_its_token_from_a_file_and_keeps_it_off_the_command_line(
        redis_url, tmp_path):
    import httpx

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    proc = subprocess.Popen([sys.executable, "-m", "emqfast", "dashboard", "--url", redis_url,
                             "--port", "0", "--auth-token-file", str(token_file)],
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        url = re.search(r"on (http://127\.0\.0\.1:\d+/)", proc.stdout.readline()).group(1)

        def overview(**headers):
            try:
                return httpx.get(url + "api/overview", headers=headers, timeout=5)
            except httpx.HTTPError:
                return None
        assert wait_until(overview, what="the dashboard").status_code == 401
        assert overview(Authorization=f"Bearer {TOKEN}").status_code == 200
        with open(f"/proc/{proc.pid}/cmdline", "rb") as cmdline:
            assert TOKEN.encode() not in cmdline.read()
    finally:
        proc.terminate()
        proc.wait(20)
    weak = tmp_path / "weak"
    weak.write_text("password")
    refused = subprocess.run([sys.executable, "-m", "emqfast", "dashboard", "--url", redis_url,
                              "--port", "0", "--auth-token-file", str(weak)], env=cli_env(),
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "at least 16" in refused.stderr
