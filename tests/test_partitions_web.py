"""The dashboard groups a partitioned queue's partitions under its logical queue: one
overview row with the summed counts, a queue page with a per-partition breakdown, job
pages and actions reaching the partition that holds the job."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from web_client import TestClient  # noqa: E402

import emqfast  # noqa: E402
from emqfast.core.keys import partition_names  # noqa: E402
from emqfast.web import create_app  # noqa: E402


@pytest.fixture
def client(redis_url):
    with TestClient(create_app(redis_url)) as c:
        yield c


@pytest.fixture
def spread(conn, qname):
    """A queue over 3 partitions: 2 completed, 1 failed, 6 pending, a grouped job."""
    q = emqfast.Queue(qname, conn, partitions=3)
    q.enqueue_many([{"n": 1}, {"n": 2}])
    failed = q.enqueue({"fail": True}, attempts=1)

    def handler(job):
        if job.payload.get("fail"):
            raise RuntimeError("boom")
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    pending = q.enqueue_many([{"p": i} for i in range(6)])
    q.enqueue({"g": 1}, group="tenant-1")
    q.schedules.upsert("digest", every_ms=3_600_000, payload={"d": 1})
    return q, failed.id, [r.id for r in pending]


def test_overview_shows_one_row_with_the_summed_counts(client, qname, spread):
    page = client.get("/").text
    row = re.search(rf'<tr data-q="{qname}">(.*?)</tr>', page, re.S).group(1)
    cells = dict(re.findall(r'data-k="(\w+)">([^<]*)<', row))
    assert cells["completed"] == "2" and cells["failed"] == "1" and cells["pending"] == "7"
    assert "3 partitions" in row
    for part in partition_names(qname, 3):
        assert f'data-q="{part}"' not in page
    data = client.get("/api/overview").json()
    mine = next(r for r in data["rows"] if r["name"] == qname)
    assert mine["counts"]["pending"] == 7


def test_queue_page_lists_jobs_and_the_partitions(client, qname, spread):
    q, failed, pending = spread
    page = client.get("/queue", params={"q": qname, "state": "pending"}).text
    assert "Partitions" in page and all(p in page for p in partition_names(qname, 3))
    assert all(job_id in page for job_id in pending)
    assert "tenant-1" in page  # the group lane, found in its partition
    api = client.get("/api/queue", params={"q": qname, "state": "pending"}).json()
    assert api["counts"]["pending"] == 7 and set(pending) <= set(api["ids"])


def test_job_page_and_actions_reach_the_jobs_partition(client, qname, spread):
    q, failed, pending = spread
    page = client.get("/job", params={"q": qname, "id": failed})
    assert page.status_code == 200 and "RuntimeError" in page.text
    assert client.get("/queue", params={"q": qname, "id": failed},
                      follow_redirects=False).status_code == 303
    token = re.search(r'name="csrf" value="([^"]+)"', page.text)
    form = {"q": qname, "action": "retry", "id": failed}
    if token:
        form["csrf"] = token.group(1)
    client.post("/job/action", data=form)
    assert q.get(failed).state == "pending"
    assert "digest" in client.get("/schedules").text
