"""The web dashboard's pages, over HTTP (Starlette's TestClient) against the
real Redis of the session: every page, the JSON its script polls, paging and search,
404/400 pages, escaping of hostile names and payloads, links under a mount prefix, no
password in any page, and the pipelined reads (web/lockstep.py)."""
from __future__ import annotations

import html
import re
import shutil
import threading
from typing import Dict

import pytest
import redis

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.applications import Starlette  # noqa: E402
from starlette.routing import Mount  # noqa: E402
from web_client import TestClient  # noqa: E402

import emqfast  # noqa: E402
from emqfast.core.keys import QueueKeys  # noqa: E402
from emqfast.core.ops import Batch, Cmd  # noqa: E402
from emqfast.web import create_app  # noqa: E402
from emqfast.web.lockstep import run_many  # noqa: E402
from conftest import start_redis_server  # noqa: E402
from waiting import wait_until  # noqa: E402

XSS_SCRIPT = "<script>alert('xss')</script>"
XSS_IMG = '"><img src=x onerror=alert(1)>'


def handler(job):
    """Fails the jobs whose payload asks to (with a hostile message), completes the rest."""
    if isinstance(job.payload, dict) and job.payload.get("fail"):
        raise RuntimeError(job.payload.get("why", "boom"))
    return {"done": job.id}


def fill(conn, name: str) -> Dict[str, str]:
    """A queue with a job in every state (and a group lane, a schedule): their ids."""
    q = emqfast.Queue(name, conn)
    ids = {
        "completed": q.enqueue({"to": "ada@example.com"}).id,
        "failed": q.enqueue({"fail": True, "why": "smtp down " + XSS_IMG}, attempts=1).id,
        "bytes": q.enqueue(b"\x00\x01 raw \xff bytes").id,
    }
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    ids["scheduled"] = q.enqueue_in({"later": True}, 3_600_000).id
    ids["pending"] = q.enqueue({"now": True}).id
    ids["grouped"] = q.enqueue({"tenant": 42}, group="tenant-42").id
    q.groups.set_concurrency("tenant-42", 2)
    q.schedules.upsert("digest", cron="0 9 * * 1", tz="Europe/Paris", payload={"d": 1})
    return ids


@pytest.fixture
def filled(conn, qname):
    return fill(conn, qname)


@pytest.fixture
def client(redis_url):
    with TestClient(create_app(redis_url)) as c:
        yield c


def text_of(page: str) -> str:
    """The page's visible text, roughly (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


# --- pages -------------------------------------------------------------------------------

def test_overview_lists_the_queue_with_its_counts(client, qname, filled):
    got = client.get("/")
    assert got.status_code == 200
    row = re.search(rf'<tr data-q="{qname}">(.*?)</tr>', got.text, re.S).group(1)
    cells = dict(re.findall(r'data-k="(\w+)">([^<]*)<', row))
    assert cells["failed"] == "1" and cells["completed"] == "2"
    assert cells["scheduled"] == "1" and cells["pending"] == "2" and cells["grouped"] == "1"
    assert "running" in row
    assert got.headers["content-security-policy"].startswith("default-src 'none'")
    assert got.headers["x-frame-options"] == "DENY"
    assert got.headers["server-timing"].startswith("app;dur=")


def test_overview_json_feeds_the_live_update(client, conn, qname, filled):
    emqfast.Queue(qname, conn).pause()
    data = client.get("/api/overview").json()
    mine = next(r for r in data["rows"] if r["name"] == qname)
    assert mine["paused"] is True and mine["counts"]["failed"] == 1
    assert set(data["chart"]) >= {"done", "failed", "peak", "points"}


def test_overview_rates_and_chart_come_from_the_counter_growth(client, conn, qname):
    q = emqfast.Queue(qname, conn)
    q.enqueue({"a": 1})
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    dash = client.app.state.dashboard
    client.get("/api/overview")  # first sample
    q.enqueue_many([{"n": i} for i in range(5)])
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    first = dash.throughput._samples[-1][0]
    # the next sample is taken once MIN_GAP_S has passed (a condition, not a sleep)
    wait_until(lambda: client.get("/api/overview") and dash.throughput._samples[-1][0] > first,
               what="a second throughput sample")
    mine = next(r for r in client.get("/api/overview").json()["rows"] if r["name"] == qname)
    assert float(mine["per_min"][0]) > 0
    assert client.get("/api/overview").json()["chart"]["done"].startswith("M")


def test_queue_page_lists_jobs_by_state_with_group_lanes(client, qname, filled):
    page = client.get("/queue", params={"q": qname, "state": "failed"})
    assert page.status_code == 200
    assert filled["failed"] in page.text and filled["completed"] not in page.text
    assert "smtp down" in text_of(page.text)
    pending = client.get("/queue", params={"q": qname, "state": "pending"}).text
    assert filled["pending"] in pending and filled["grouped"] in pending
    assert "tenant-42" in pending and "Group lanes" in pending
    lanes = pending.split("Group lanes", 1)[1]
    lane = re.search(r"<td>tenant-42</td>(.*?)</tr>", lanes, re.S).group(1)
    assert re.findall(r">(\w+)<", lane)[:3] == ["1", "0", "2"]  # waiting, active, cap
    assert "Wait (due" in pending and "<rect" in pending  # the histograms


def test_queue_page_pages_with_a_cursor(client, conn, qname):
    q = emqfast.Queue(qname, conn)
    ids = [r.id for r in q.enqueue_many([{"n": i} for i in range(120)])]
    first = client.get("/queue", params={"q": qname, "state": "pending"}).text
    assert ids[0] in first and ids[49] in first and ids[50] not in first
    assert "1–50 of 120" in first
    nxt = html.unescape(re.search(r'href="([^"]+)">next', first).group(1))
    second = client.get(nxt).text
    assert ids[50] in second and ids[99] in second and ids[49] not in second
    last = client.get("/queue", params={"q": qname, "state": "pending", "start": 100}).text
    assert ids[119] in last and "101–120 of 120" in last and "next →" not in last


def test_search_by_id_opens_the_job_or_says_why_not(client, qname, filled):
    found = client.get("/queue", params={"q": qname, "id": filled["failed"]},
                       follow_redirects=False)
    assert found.status_code == 303 and "/job?" in found.headers["location"]
    assert client.get("/queue", params={"q": qname, "id": "JOBnope"}).status_code == 404
    assert client.get("/queue", params={"q": qname, "id": "nope"}).status_code == 400


def test_job_page_shows_everything_about_a_failed_job(client, qname, filled):
    page = client.get("/job", params={"q": qname, "id": filled["failed"]})
    assert page.status_code == 200
    shown = text_of(page.text)
    assert '"fail": true' in shown and "RuntimeError" in shown and "Traceback" in shown
    assert "1 of 1" in shown  # attempts
    assert re.search(r"enqueued.*active.*failed", shown, re.S)  # the timeline, in order
    assert 'value="retry"' in page.text and 'value="cancel"' not in page.text


def test_job_page_of_a_completed_job_shows_result_and_run(client, qname, filled):
    shown = text_of(client.get("/job", params={"q": qname, "id": filled["completed"]}).text)
    assert '"done"' in shown and "completed" in shown and "ran " in shown


def test_job_page_of_an_active_job_shows_its_lease(client, conn, qname):
    q = emqfast.Queue(qname, conn)
    ref = q.enqueue({"slow": True})
    gate, started = threading.Event(), threading.Event()

    def slow(job):
        started.set()
        gate.wait(20)
    w = emqfast.Worker(q, slow, concurrency=1)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        wait_until(started.is_set, what="the handler to start")
        shown = text_of(client.get("/job", params={"q": qname, "id": ref.id}).text)
        assert "held by" in shown and w.name in shown and "left" in shown
        workers = text_of(client.get("/workers").text)
        assert w.name in workers and "thread" in workers
    finally:
        gate.set()
        w.stop()
        t.join(30)


def test_bytes_payload_is_an_escaped_preview_with_a_download(client, qname, filled):
    page = client.get("/job", params={"q": qname, "id": filled["bytes"]})
    assert "\\x00\\x01 raw \\xff bytes" in html.unescape(page.text)
    got = client.get("/job/payload", params={"q": qname, "id": filled["bytes"]})
    assert got.content == b"\x00\x01 raw \xff bytes"
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["content-disposition"].startswith("attachment")


def test_a_big_payload_is_cut_at_64_kb_and_downloads_whole(client, conn, qname):
    big = {"blob": "x" * 200_000}
    ref = emqfast.Queue(qname, conn).enqueue(big)
    page = client.get("/job", params={"q": qname, "id": ref.id}).text
    assert "Showing the first 64 KB" in page
    assert len(page) < 100_000
    got = client.get("/job/payload", params={"q": qname, "id": ref.id})
    assert got.json() == big


def test_schedules_leaderboards_and_workers_pages(client, conn, qname, filled):
    shown = text_of(client.get("/schedules").text)
    assert "digest" in shown and "0 9 * * 1" in shown and "Europe/Paris" in shown
    board = emqfast.Leaderboard(conn, qname)
    board.set_many({"ada": 92, "alan": 89, "grace": 87})
    page = text_of(client.get("/leaderboards").text)
    assert re.search(r"1\s+ada\s+92", page)
    looked = text_of(client.get("/leaderboards", params={"board": qname, "member": "grace"}).text)
    assert "grace is #3" in looked
    assert client.get("/workers").status_code == 200


def test_unknown_and_malformed_give_404_and_400_pages(client, qname, filled):
    assert client.get("/queue", params={"q": "no-such-" + qname}).status_code == 404
    assert client.get("/queue", params={"q": "bad{name}"}).status_code == 400
    assert client.get("/queue", params={"q": qname, "state": "lost"}).status_code == 400
    assert client.get("/queue", params={"q": qname, "start": "-1"}).status_code == 400
    assert client.get("/queue", params={"q": qname, "start": "²"}).status_code == 400
    assert client.get("/queue").status_code == 400
    assert client.get("/job", params={"q": qname, "id": "notajob"}).status_code == 400
    missing = client.get("/job", params={"q": qname, "id": "JOBmissing"})
    assert missing.status_code == 404 and "Not found" in missing.text
    assert client.get("/api/job", params={"q": qname, "id": "JOBmissing"}).json()["error"]


def test_a_fixed_queue_list_hides_the_others(redis_url, conn, qname, filled):
    other = qname + "-other"
    emqfast.Queue(other, conn).enqueue({"x": 1})
    with TestClient(create_app(redis_url, queues=[qname])) as c:
        assert other not in c.get("/").text
        assert c.get("/queue", params={"q": other}).status_code == 404


# --- escaping ------------------------------------------------------------------------------

@pytest.mark.parametrize("hostile", [XSS_SCRIPT, XSS_IMG])
def test_hostile_names_payloads_and_errors_render_as_text(client, conn, hostile):
    q = emqfast.Queue("x" + hostile, conn)
    job_id = "JOB" + hostile
    q.enqueue({"p": hostile}, job_id=job_id)
    q.enqueue({"fail": True, "why": hostile}, job_id="JOBf" + hostile, attempts=1)
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    q.enqueue({"p": hostile}, job_id="JOBp" + hostile)
    q.schedules.upsert("s" + hostile, every_ms=60_000, payload=hostile)
    emqfast.Leaderboard(conn, "lb" + hostile).set(hostile, 1)
    pages = [client.get("/"), client.get("/queue", params={"q": q.name, "state": "pending"}),
             client.get("/queue", params={"q": q.name, "state": "failed"}),
             client.get("/job", params={"q": q.name, "id": job_id}),
             client.get("/job", params={"q": q.name, "id": "JOBf" + hostile}),
             client.get("/schedules"), client.get("/leaderboards"),
             client.get("/queue", params={"q": q.name, "id": "JOBzz" + hostile}),
             client.get("/queue", params={"q": "nope" + hostile})]
    for page in pages:
        assert "<script>alert" not in page.text and "<img src=x" not in page.text, page.url
    assert hostile in text_of(pages[3].text) and hostile in text_of(pages[4].text)
    assert "&lt;" in pages[0].text


# --- mounting, secrets ---------------------------------------------------------------------

def test_links_work_under_a_mount_prefix(redis_url, qname, filled):
    outer = Starlette(routes=[Mount("/admin/emq", app=create_app(redis_url))])
    with TestClient(outer) as c:
        page = c.get("/admin/emq/").text
        hrefs = re.findall(r'(?:href|src|action)="([^"]+)"', page)
        assert hrefs and all(h.startswith("/admin/emq/") for h in hrefs), hrefs
        queue_link = html.unescape(next(h for h in hrefs if f"q={qname}" in h))
        job_page = c.get(queue_link + "&state=failed")
        assert job_page.status_code == 200 and filled["failed"] in job_page.text
        assert c.get("/admin/emq/static/app.css").status_code == 200


def test_no_password_in_any_page():
    secret = "s3cret-Pa55word"
    proc, port, workdir = start_redis_server()
    try:
        redis.Redis(port=port).config_set("requirepass", secret)
        url = f"redis://:{secret}@127.0.0.1:{port}/0"
        conn = redis.Redis.from_url(url)
        fill(conn, "pw")
        with TestClient(create_app(url)) as c:
            for path in ("/", "/queue?q=pw", "/queue?q=pw&state=failed", "/schedules",
                         "/leaderboards", "/workers", "/api/overview", "/queue?q=missing"):
                assert secret not in c.get(path).text, path
        conn.close()
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


# --- pipelined reads ---------------------------------------------------------------------------

class CountingRedis(redis.Redis):
    pipelines = 0

    def pipeline(self, *a, **kw):
        type(self).pipelines += 1
        return super().pipeline(*a, **kw)


def test_run_many_reads_every_queue_in_one_round_trip_per_step(redis_url, conn, qname):
    names = [f"{qname}-{i}" for i in range(30)]
    for n in names:
        emqfast.Queue(n, conn).enqueue({"n": n})
    counting = CountingRedis.from_url(redis_url)
    queues = [emqfast.Queue(n, counting) for n in names]
    CountingRedis.pipelines = 0
    got = run_many(counting, [emqfast.Queue.counts.op(q) for q in queues])
    assert CountingRedis.pipelines == 1
    assert got == [q.counts() for q in queues]


def test_run_many_keeps_one_failure_to_its_own_operation(conn, qname):
    conn.set(QueueKeys(qname).pending, "not a zset")  # WRONGTYPE for this one
    good, bad = emqfast.Queue(qname + "-ok", conn), emqfast.Queue(qname, conn)
    got = run_many(conn, [emqfast.Queue.counts.op(good), emqfast.Queue.counts.op(bad)])
    assert got[0]["pending"] == 0 and isinstance(got[1], Exception)

    def batch_op():
        return (yield Batch([Cmd.of("TIME"), Cmd.of("ZCARD", QueueKeys(qname).delayed)]))
    assert run_many(conn, [batch_op()])[0][1] == 0
    conn.delete(QueueKeys(qname).pending)


def test_run_many_replies_match_redis_py(conn, qname):
    """The packed fast path puts replies through redis-py's callbacks: same values."""
    key = QueueKeys(qname)
    conn.zadd(key.delayed, {"a": 1.5, "b": 2})
    conn.hset(key.meta, mapping={"x": "1", "y": "2"})

    def op():
        return (yield Batch([Cmd.of("ZRANGE", key.delayed, 0, -1, "WITHSCORES", withscores=True),
                             Cmd.of("HGETALL", key.meta), Cmd.of("ZSCORE", key.delayed, "a"),
                             Cmd.of("EXISTS", key.meta)]))
    got = run_many(conn, [op()])[0]
    assert got == [conn.zrange(key.delayed, 0, -1, withscores=True), conn.hgetall(key.meta),
                   1.5, 1]
    conn.delete(key.delayed, key.meta)


def test_discovery_rescans_in_the_background(conn, qname):
    from emqfast.web.reads import Discovery

    emqfast.Queue(qname, conn).enqueue({"n": 1})
    found = Discovery(conn)
    assert qname in found.names()  # the first call scans at once
    newer = qname + "-new"
    emqfast.Queue(newer, conn).enqueue({"n": 1})
    assert newer not in found.names()  # cached
    found._at -= 3600  # the cache is old: the next call answers from it and rescans
    found.names()
    wait_until(lambda: newer in found.names(), what="the background scan to find it")
    wait_until(lambda: not found._scanning, what="the background scan to end")


def test_job_page_shows_progress_in_its_section_and_timeline(client, conn, qname):
    q = emqfast.Queue(qname, conn)
    ref = q.enqueue({"n": 1})

    def reporting(job):
        job.progress({"pct": 50})
        return "ok"
    emqfast.Worker(q, reporting).run_until_idle(timeout_s=30)
    shown = text_of(client.get("/job", params={"q": qname, "id": ref.id}).text)
    assert "Progress" in shown and '"pct": 50' in shown
    assert re.search(r"active.*progress.*completed", shown, re.S)
