"""The dashboard's words and small pages: a bad ``state`` lists every state there is, a
missing job's 404 says what really removes a job, an unknown address gets a styled 404
page (page headers, a link home), the favicon is served, and a login goes back to the
page asked for."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from web_client import TestClient  # noqa: E402

import emqfast  # noqa: E402
from emqfast.facade.job import STATES  # noqa: E402
from emqfast.web import create_app  # noqa: E402

TOKEN = "Strong-token-9f3Kq2xZ"


@pytest.fixture
def client(redis_url):
    with TestClient(create_app(redis_url)) as c:
        yield c


def test_a_bad_state_lists_every_state(client, conn, qname):
    emqfast.Queue(qname, conn).enqueue({"n": 1})
    got = client.get("/queue", params={"q": qname, "state": "lost"})
    assert got.status_code == 400
    listed = re.search(r"state must be one of ([a-z_, ]+)", got.text).group(1)
    assert [s.strip() for s in listed.split(",")] == list(STATES)
    for state in STATES:  # and each of them opens
        assert client.get("/queue", params={"q": qname, "state": state}).status_code == 200


def test_a_missing_job_says_what_removes_a_job(client, conn, qname):
    q = emqfast.Queue(qname, conn)
    q.enqueue({"n": 1})
    for path, params in (("/job", {"q": qname, "id": "JOBgone"}),
                         ("/queue", {"q": qname, "id": "JOBgone"}),
                         ("/job/payload", {"q": qname, "id": "JOBgone"})):
        got = client.get(path, params=params)
        assert got.status_code == 404
        text = got.text
        assert "cancelled or" not in text  # cancelled jobs are kept: that is no reason
        for reason in ("deleted", "trimmed by retention", "obliterated"):
            assert reason in text, (path, reason)
    kept = q.enqueue({"n": 2}).id
    q.cancel(kept)
    assert client.get("/job", params={"q": qname, "id": kept}).status_code == 200


def test_an_unknown_address_gets_a_styled_404_page(client):
    for path in ("/nothing", "/static/nothing.js", "/queue/nothing"):
        got = client.get(path)
        assert got.status_code == 404
        assert got.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in got.headers["content-security-policy"]
        assert got.headers["x-frame-options"] == "DENY"
        assert "404 · Not found" in got.text and '<header class="top">' in got.text
        assert '<a href="/">Back to the queues</a>' in got.text
        assert "app.css" in got.text  # styled like every page
    api = client.get("/api/nothing")
    assert api.status_code == 404 and api.json() == {"error": "there is no page at this address"}
    wrong = client.post("/")
    assert wrong.status_code == 405 and "Method not allowed" in wrong.text
    assert "GET" in wrong.headers["allow"]


def test_the_favicon_is_served_with_the_page_headers(client):
    page = client.get("/")
    assert re.search(r'<link rel="icon" href="/static/favicon.svg"', page.text)
    for path in ("/favicon.ico", "/static/favicon.svg"):
        icon = client.get(path)
        assert icon.status_code == 200, path
        assert icon.headers["content-type"].startswith("image/svg+xml")
        assert icon.text.startswith("<svg")
        assert "default-src 'none'" in icon.headers["content-security-policy"]


def _csrf(c: TestClient) -> str:
    c.get("/login")
    return c.cookies.get("emq_csrf")


def test_login_goes_back_to_the_page_asked_for(redis_url, conn, qname):
    emqfast.Queue(qname, conn).enqueue({"n": 1})
    with TestClient(create_app(redis_url, auth=TOKEN)) as c:
        asked = c.get("/queue", params={"q": qname, "state": "failed"}, follow_redirects=False)
        assert asked.status_code == 303
        login_url = asked.headers["location"]
        assert login_url.startswith("/login?next=")
        form = c.get(login_url)
        wanted = f"/queue?q={qname}&amp;state=failed"
        assert f'name="next" value="{wanted}"' in form.text
        done = c.post("/login", data={"csrf": c.cookies.get("emq_csrf"), "token": TOKEN,
                                      "next": f"/queue?q={qname}&state=failed"},
                      follow_redirects=False)
        assert done.status_code == 303
        assert done.headers["location"] == f"/queue?q={qname}&state=failed"
        assert c.get(done.headers["location"]).status_code == 200
        again = c.get("/login", params={"next": "/workers"}, follow_redirects=False)
        assert again.status_code == 303 and again.headers["location"] == "/workers"


@pytest.mark.parametrize("where", ["//evil.example", "https://evil.example",
                                   "/\\evil.example", "//evil.example/queue",
                                   "javascript:alert(1)", "evil.example", "/\t/evil.example",
                                   "http:/evil.example", " //evil.example"])
def test_login_never_sends_you_to_another_site(redis_url, where):
    with TestClient(create_app(redis_url, auth=TOKEN)) as c:
        form = c.get("/login", params={"next": where})
        assert "evil" not in form.text  # not carried into the form either
        done = c.post("/login", data={"csrf": _csrf(c), "token": TOKEN, "next": where},
                      follow_redirects=False)
        assert done.status_code == 303 and done.headers["location"] == "/"
