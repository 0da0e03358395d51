"""The dashboard's per-job "Promote now" (scheduled jobs) and "Delete" (jobs that
are not active), on the job page and the queue page's rows, over HTTP against the real
Redis: POST + CSRF like every action, each through ``Queue.promote_job`` / ``Queue.delete``;
a wrong-state action shows the typed error and changes nothing; read-only mode hides the
buttons and refuses the actions with 403."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from web_client import TestClient  # noqa: E402

import emqfast  # noqa: E402
from emqfast.web import create_app  # noqa: E402
from conftest import dump_queue  # noqa: E402
from engine_util import claim  # noqa: E402
from test_web_actions import flash_of, post  # noqa: E402
from test_web_pages import fill  # noqa: E402


@pytest.fixture
def client(redis_url):
    with TestClient(create_app(redis_url)) as c:
        c.get("/")  # the CSRF cookie
        yield c


def _buttons(page: str) -> list:
    body = page.split("</header>", 1)[1]
    return re.findall(r">(Promote now|Delete)<", body)


def test_job_page_offers_promote_on_a_scheduled_job_and_delete_when_not_active(
        client, conn, qname):
    ids = fill(conn, qname)
    scheduled = client.get("/job", params={"q": qname, "id": ids["scheduled"]}).text
    assert _buttons(scheduled) == ["Promote now", "Delete"]
    failed = client.get("/job", params={"q": qname, "id": ids["failed"]}).text
    assert _buttons(failed) == ["Delete"]
    active = emqfast.Queue(qname, conn).enqueue("busy").id
    claim(emqfast.Queue(qname, conn), "w", lease_ms=60_000, n=10)
    page = client.get("/job", params={"q": qname, "id": active}).text
    assert _buttons(page) == []


def test_promote_a_scheduled_job_from_its_page(client, conn, qname):
    ids = fill(conn, qname)
    got = post(client, "/job/action", q=qname, id=ids["scheduled"], action="promote")
    assert got.status_code == 200 and f"/job?q={qname}" in str(got.url)
    assert flash_of(got.text) == f"ok: {ids['scheduled']} is due now"
    assert emqfast.Queue(qname, conn).get(ids["scheduled"]).state == "pending"


@pytest.mark.parametrize("state", ["pending", "completed", "failed"])
def test_promote_in_the_wrong_state_shows_the_typed_error_and_changes_nothing(
        client, conn, qname, state):
    ids = fill(conn, qname)
    before = dump_queue(conn, qname)
    got = post(client, "/job/action", q=qname, id=ids[state], action="promote")
    assert flash_of(got.text).startswith(f"error: JobStateError: cannot promote {ids[state]}: "
                                         f"it is {state}")
    assert dump_queue(conn, qname) == before


@pytest.mark.parametrize("state", ["completed", "failed", "scheduled", "pending", "grouped"])
def test_delete_a_job_from_its_page(client, conn, qname, state):
    ids = fill(conn, qname)
    got = post(client, "/job/action", q=qname, id=ids[state], action="delete")
    assert flash_of(got.text) == f"ok: deleted {ids[state]}"
    assert "/queue?" in str(got.url)  # the job is gone: back to its queue
    assert emqfast.Queue(qname, conn).get(ids[state]) is None


def test_delete_an_active_job_is_refused_and_changes_nothing(client, conn, qname):
    q = emqfast.Queue(qname, conn)
    active = q.enqueue("busy").id
    claim(q, "w", lease_ms=60_000)
    before = dump_queue(conn, qname)
    got = post(client, "/job/action", q=qname, id=active, action="delete")
    assert flash_of(got.text).startswith(f"error: JobStateError: cannot delete {active}: "
                                         "it is active")
    assert dump_queue(conn, qname) == before


def test_row_buttons_promote_and_delete(client, conn, qname):
    ids = fill(conn, qname)
    page = client.get("/queue", params={"q": qname, "state": "scheduled"}).text
    assert f'value="promote:{ids["scheduled"]}"' in page
    assert f'value="delete:{ids["scheduled"]}"' in page
    failed_rows = client.get("/queue", params={"q": qname, "state": "failed"}).text
    assert 'value="promote:' not in failed_rows and f'value="delete:{ids["failed"]}"' in failed_rows
    got = post(client, "/queue/action", q=qname, state="scheduled",
               row=f"promote:{ids['scheduled']}")
    assert flash_of(got.text) == f"ok: {ids['scheduled']} is due now"
    q = emqfast.Queue(qname, conn)
    assert q.get(ids["scheduled"]).state == "pending"
    before = dump_queue(conn, qname)
    refused = post(client, "/queue/action", q=qname, state="scheduled",
                   row=f"promote:{ids['scheduled']}")  # pending now: refused
    assert flash_of(refused.text).startswith("error: JobStateError")
    assert dump_queue(conn, qname) == before
    got = post(client, "/queue/action", q=qname, state="failed", row=f"delete:{ids['failed']}")
    assert flash_of(got.text) == f"ok: deleted {ids['failed']}"
    assert q.get(ids["failed"]) is None and conn.zcard(q.keys.failed) == 0


def test_read_only_hides_promote_and_delete_and_refuses_them(redis_url, conn, qname):
    ids = fill(conn, qname)
    before = dump_queue(conn, qname)
    with TestClient(create_app(redis_url, read_only=True)) as c:
        for params in ({"q": qname, "state": "scheduled"}, {"q": qname, "state": "failed"}):
            assert _buttons(c.get("/queue", params=params).text) == []
        assert _buttons(c.get("/job", params={"q": qname, "id": ids["scheduled"]}).text) == []
        csrf = c.cookies.get("emq_csrf")
        for action, job in (("promote", "scheduled"), ("delete", "failed")):
            got = c.post("/job/action", data={"q": qname, "id": ids[job], "action": action,
                                              "csrf": csrf})
            assert got.status_code == 403 and "read-only" in got.text
            row = c.post("/queue/action", data={"q": qname, "state": "failed", "csrf": csrf,
                                                "row": f"{action}:{ids[job]}"})
            assert row.status_code == 403
    assert dump_queue(conn, qname) == before


def test_promote_and_delete_need_the_csrf_token(client, conn, qname):
    ids = fill(conn, qname)
    before = dump_queue(conn, qname)
    for action, job in (("promote", "scheduled"), ("delete", "failed")):
        form = {"q": qname, "id": ids[job], "action": action}
        assert client.post("/job/action", data=form).status_code == 403
        assert client.post("/job/action", data={**form, "csrf": "forged"}).status_code == 403
    assert dump_queue(conn, qname) == before
