"""The dashboard's actions over HTTP against the real Redis: each goes through a
Queue method and shows in Redis; a wrong-state action shows the typed error and changes
nothing; POST + CSRF token for every action; read-only mode hides and refuses them; the
auth token by header or login form."""
from __future__ import annotations

import re
import threading
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from web_client import TestClient  # noqa: E402

import emqfast  # noqa: E402
from emqfast.core.keys import QueueKeys  # noqa: E402
from emqfast.web import create_app  # noqa: E402
from conftest import dump_queue  # noqa: E402
from engine_util import wait_server_past  # noqa: E402
from waiting import wait_until  # noqa: E402
from test_web_pages import fill, handler, text_of  # noqa: E402

TOKEN = "tok-Qx7vR2mK9pLw4sTz"  # 16+ characters, not from a tiny alphabet


@pytest.fixture
def client(redis_url):
    with TestClient(create_app(redis_url)) as c:
        c.get("/")  # the CSRF cookie
        yield c


def post(c: TestClient, path: str, **form):
    return c.post(path, data={"csrf": c.cookies.get("emq_csrf"), **form})


def flash_of(page: str) -> str:
    found = re.search(r'<p class="flash (\w+)" role="status">([^<]*)', page)
    return f"{found.group(1)}: {text_of(found.group(2))}" if found else ""


# --- one job ---------------------------------------------------------------------------------

def test_retry_a_failed_job(client, conn, qname):
    ids = fill(conn, qname)
    got = post(client, "/job/action", q=qname, id=ids["failed"], action="retry")
    assert got.status_code == 200 and f"/job?q={qname}" in str(got.url)
    assert flash_of(got.text).startswith("ok:")
    assert emqfast.Queue(qname, conn).get(ids["failed"]).state == "pending"
    assert 'data-job-state>pending<' in got.text


@pytest.mark.parametrize("state", ["pending", "completed", "scheduled"])
def test_retry_in_the_wrong_state_shows_the_typed_error_and_changes_nothing(
        client, conn, qname, state):
    ids = fill(conn, qname)
    before = dump_queue(conn, qname)
    got = post(client, "/job/action", q=qname, id=ids[state], action="retry")
    assert flash_of(got.text).startswith("error: JobStateError")
    assert dump_queue(conn, qname) == before


def test_cancel_a_waiting_job_and_refuse_a_finished_one(client, conn, qname):
    ids = fill(conn, qname)
    q = emqfast.Queue(qname, conn)
    got = post(client, "/job/action", q=qname, id=ids["scheduled"], action="cancel")
    gone = q.get(ids["scheduled"])  # deleted, or its record kept as cancelled
    assert flash_of(got.text).startswith("ok: cancelled") and (gone is None or
                                                                gone.state == "cancelled")
    assert "/queue?" in str(got.url)
    before = dump_queue(conn, qname)
    refused = post(client, "/job/action", q=qname, id=ids["completed"], action="cancel")
    assert flash_of(refused.text) == (f"error: JobStateError: job {ids['completed']} is "
                                      "completed: only a waiting or running job can be "
                                      "cancelled")
    assert dump_queue(conn, qname) == before


def test_job_actions_check_their_input(client, conn, qname):
    ids = fill(conn, qname)
    assert post(client, "/job/action", q=qname, id="nope", action="retry").status_code == 400
    assert post(client, "/job/action", q=qname, id=ids["failed"],
                action="explode").status_code == 400
    assert post(client, "/job/action", q="missing-" + qname, id=ids["failed"],
                action="retry").status_code == 404
    unknown = post(client, "/job/action", q=qname, id="JOBunknown", action="retry")
    assert flash_of(unknown.text).startswith("error: JobNotFound")


# --- the queue -------------------------------------------------------------------------------

def test_row_and_bulk_actions_on_the_job_list(client, conn, qname):
    q = emqfast.Queue(qname, conn)
    failed = [q.enqueue({"fail": True}, attempts=1).id for _ in range(3)]
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    got = post(client, "/queue/action", q=qname, state="failed", row=f"retry:{failed[0]}")
    assert flash_of(got.text).startswith("ok:") and q.get(failed[0]).state == "pending"
    got = client.post("/queue/action", data={"csrf": client.cookies.get("emq_csrf"), "q": qname,
                                             "state": "failed", "action": "retry_selected",
                                             "ids": failed})
    assert flash_of(got.text).startswith("error: retried 2 of 3; refused: JobStateError")
    assert [q.get(i).state for i in failed] == ["pending"] * 3
    got = client.post("/queue/action", data={"csrf": client.cookies.get("emq_csrf"), "q": qname,
                                             "state": "pending", "action": "cancel_selected",
                                             "ids": failed[:2]})
    assert flash_of(got.text) == "ok: cancelled 2 job(s)"
    assert q.counts()["pending"] == 1


def test_pause_resume_promote_retry_all_and_trim(client, conn, qname):
    ids = fill(conn, qname)
    q = emqfast.Queue(qname, conn)
    post(client, "/queue/action", q=qname, action="pause")
    assert q.is_paused()
    page = client.get("/queue", params={"q": qname}).text
    assert 'value="resume"' in page and "paused" in page
    post(client, "/queue/action", q=qname, action="resume")
    assert not q.is_paused()
    due = q.enqueue_in({"due": True}, 30).id
    wait_server_past(conn, q.get(due).run_at_ms)
    got = post(client, "/queue/action", q=qname, action="promote")
    assert flash_of(got.text) == "ok: promoted 1 due job(s)" and q.get(due).state == "pending"
    got = post(client, "/queue/action", q=qname, action="retry_all")
    assert flash_of(got.text) == "ok: retried 1 failed job(s)"
    assert q.get(ids["failed"]).state == "pending"
    got = post(client, "/queue/action", q=qname, action="trim", keep_completed="0",
               keep_failed="0")
    assert flash_of(got.text) == "ok: trimmed 2 finished job(s)" and q.counts()["completed"] == 0
    assert post(client, "/queue/action", q=qname, action="trim",
                keep_completed="-3").status_code == 400
    assert post(client, "/queue/action", q=qname, action="explode").status_code == 400


def test_delete_a_queue_needs_its_name_typed(client, conn, qname):
    fill(conn, qname)
    kept = post(client, "/queue/action", q=qname, action="delete", confirm="wrong")
    assert flash_of(kept.text).startswith("error: type the queue")
    assert conn.exists(QueueKeys(qname).meta)
    gone = post(client, "/queue/action", q=qname, action="delete", confirm=qname)
    assert flash_of(gone.text).startswith(f"ok: deleted queue {qname}")
    assert dump_queue(conn, qname) == {}
    assert f'data-q="{qname}"' not in gone.text


def test_remove_a_schedule(client, conn, qname):
    fill(conn, qname)
    got = post(client, "/schedules/remove", q=qname, name="digest")
    assert flash_of(got.text) == f"ok: removed schedule digest of {qname}"
    assert emqfast.Queue(qname, conn).schedules.get("digest") is None


# --- CSRF, methods, read-only ----------------------------------------------------------------

def test_actions_need_post_and_the_csrf_token(client, conn, qname):
    ids = fill(conn, qname)
    before = dump_queue(conn, qname)
    form = {"q": qname, "id": ids["failed"], "action": "retry"}
    assert client.post("/job/action", data=form).status_code == 403
    assert client.post("/job/action", data={**form, "csrf": "forged"}).status_code == 403
    assert client.get("/job/action", params=form).status_code == 405
    fresh = TestClient(client.app)  # another browser: no cookie at all
    assert fresh.post("/job/action", data={**form, "csrf": "x"}).status_code == 403
    assert dump_queue(conn, qname) == before
    page = client.get("/job", params={"q": qname, "id": ids["failed"]}).text
    assert f'name="csrf" value="{client.cookies.get("emq_csrf")}"' in page


def test_read_only_hides_actions_and_refuses_them(redis_url, conn, qname):
    ids = fill(conn, qname)
    before = dump_queue(conn, qname)
    with TestClient(create_app(redis_url, read_only=True)) as c:
        for path, params in (("/queue", {"q": qname, "state": "failed"}),
                             ("/job", {"q": qname, "id": ids["failed"]}), ("/schedules", {})):
            page = c.get(path, params=params).text
            assert "read-only" in page
            body = page.split("</header>", 1)[1]
            assert 'method="post"' not in body and 'name="row"' not in body
            assert not re.search(r">(Retry|Cancel|Pause|Trim|Remove|Delete queue)<", body)
        csrf = c.cookies.get("emq_csrf")
        for path, form in (("/job/action", {"q": qname, "id": ids["failed"], "action": "retry"}),
                           ("/queue/action", {"q": qname, "action": "pause"}),
                           ("/schedules/remove", {"q": qname, "name": "digest"})):
            got = c.post(path, data={**form, "csrf": csrf})
            assert got.status_code == 403 and "read-only" in got.text
    assert dump_queue(conn, qname) == before


# --- auth ------------------------------------------------------------------------------------

def test_auth_token_by_header_or_login_form(redis_url, conn, qname):
    fill(conn, qname)
    with TestClient(create_app(redis_url, auth=TOKEN)) as c:
        first = c.get("/", follow_redirects=False)
        assert first.status_code == 303 and first.headers["location"].endswith("/login")
        assert c.get("/api/overview").status_code == 401
        assert c.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert c.get("/api/overview", headers={"X-Emqfast-Token": TOKEN}).status_code == 200
        assert c.get("/", headers={"Authorization": "Bearer wrong-token"},
                     follow_redirects=False).status_code == 303
        c.get("/login")
        wrong = c.post("/login", data={"csrf": c.cookies.get("emq_csrf"), "token": "nope"})
        assert wrong.status_code == 401 and "not the right one" in wrong.text
        right = c.post("/login", data={"csrf": c.cookies.get("emq_csrf"), "token": TOKEN})
        assert right.status_code == 200 and f'data-q="{qname}"' in right.text
        assert TOKEN not in str(c.cookies.get("emq_auth"))
        c.post("/logout", data={"csrf": c.cookies.get("emq_csrf")})
        assert c.get("/", follow_redirects=False).status_code == 303


def test_an_action_by_header_needs_no_csrf_but_the_token(redis_url, conn, qname):
    ids = fill(conn, qname)
    with TestClient(create_app(redis_url, auth=TOKEN)) as c:
        form = {"q": qname, "id": ids["failed"], "action": "retry"}
        assert c.post("/job/action", data=form).status_code == 401
        ok = c.post("/job/action", data=form, headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
    assert emqfast.Queue(qname, conn).get(ids["failed"]).state == "pending"


def test_a_short_token_is_refused():
    with pytest.raises(emqfast.InvalidInput, match="at least 16"):
        create_app("redis://127.0.0.1:1/0", auth="short")


def test_cancel_a_running_job_asks_its_worker_and_stays_on_its_page(client, conn, qname):
    """The dashboard's Cancel on a running job asks its worker (q.cancel answers
    'requested'); the page stays on the job, which ends cancelled once the worker stops it."""
    q = emqfast.Queue(qname, conn)
    started = threading.Event()

    def handler(job):
        started.set()
        while not job.cancelled:
            time.sleep(0.005)
        job.raise_if_cancelled()

    ref = q.enqueue("long")
    worker = emqfast.Worker(q, handler)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert started.wait(20)
        got = post(client, "/job/action", q=qname, id=ref.id, action="cancel")
        assert flash_of(got.text).startswith(f"ok: asked the worker running {ref.id}")
        assert "/job?" in str(got.url)
        wait_until(lambda: q.get(ref.id).state == "cancelled", what="the job ends cancelled")
        assert q.get(ref.id).attempts == 1  # never retried
        wait_until(lambda: worker.stats.cancelled == 1, what="the worker counts it")
        assert worker.stats.failed == 0
    finally:
        worker.stop()
        thread.join(20)
