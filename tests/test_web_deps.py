"""A job's dependencies on its dashboard page: the jobs it depends on and the jobs
waiting on it, as links with their states (never the raw ``{"d": [...]}`` option), and
for a job failed with ``dependency failed``, the dependency that did not complete."""
from __future__ import annotations

import html
import re

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from web_client import TestClient  # noqa: E402

import emqfast  # noqa: E402
from emqfast.web import create_app  # noqa: E402


def handler(job):
    if job.payload == "fail":
        raise RuntimeError("card declined")
    return "ok"


def section(page: str, ident: str) -> str:
    found = re.search(rf'<ul class="links" id="{ident}">(.*?)</ul>', page, re.S)
    assert found, page
    return found.group(1)


def test_a_failed_dependency_is_named_and_linked(redis_url, conn, qname):
    billing = emqfast.Queue(qname + "-billing", conn)
    q = emqfast.Queue(qname, conn)
    charge = billing.enqueue("fail", attempts=1)
    render = q.enqueue("ok")
    invoice = q.enqueue("invoice", depends_on=[(billing.name, charge.id), render])
    for queue in (q, billing):
        emqfast.Worker(queue, handler).run_until_idle(timeout_s=30)
    q.settle_dependencies()
    billing.settle_dependencies()
    assert q.get(invoice.id).error == "dependency failed"
    # dep_resolve.lua names the dependency that failed it, in the job's hash
    assert conn.hmget(q.keys.job(invoice.id), "dep_failed", "dep_outcome") == \
        [f"{billing.name}\0{charge.id}".encode(), b"failed"]
    with TestClient(create_app(redis_url)) as c:
        page = c.get("/job", params={"q": qname, "id": invoice.id}).text
    assert '{"d"' not in html.unescape(page)  # no raw option dump
    deps = section(page, "depends-on")
    charge_link = f'href="/job?q={billing.name}&amp;id={charge.id}"'
    assert charge_link in deps and f'href="/job?q={qname}&amp;id={render.id}"' in deps
    charge_item = next(li for li in deps.split("<li>") if charge.id in li)
    assert "st-failed" in charge_item and "failed this job: it ended failed" in charge_item
    render_item = next(li for li in deps.split("<li>") if render.id in li)
    assert "st-completed" in render_item and "culprit" not in render_item
    culprit = re.search(r'<p id="culprit">(.*?)</p>', page, re.S).group(1)
    assert charge_link in culprit and "ended <b>failed</b>" in culprit


def test_dependents_waiting_on_a_job_are_listed_with_their_states(redis_url, conn, qname):
    q = emqfast.Queue(qname, conn)
    first = q.enqueue("grade", delay_ms=3_600_000)
    cert = q.enqueue("certificate", depends_on=[first])
    with TestClient(create_app(redis_url)) as c:
        page = c.get("/job", params={"q": qname, "id": first.id}).text
        waiting = section(page, "dependents")
        assert cert.id in waiting and "st-waiting_deps" in waiting
        assert "Waiting on it <small>(1)</small>" in page
        mine = c.get("/job", params={"q": qname, "id": cert.id}).text
        deps = section(mine, "depends-on")
        assert first.id in deps and "st-scheduled" in deps
        assert "culprit" not in deps


def test_a_gone_dependency_shows_as_gone(redis_url, conn, qname):
    q = emqfast.Queue(qname, conn)
    first = q.enqueue("grade", delay_ms=3_600_000)
    cert = q.enqueue("certificate", depends_on=[first], on_dep_failure="run")
    q.delete(first.id)
    with TestClient(create_app(redis_url)) as c:
        deps = section(c.get("/job", params={"q": qname, "id": cert.id}).text, "depends-on")
    assert first.id in deps and "st-gone" in deps


def test_the_flow_graph_links_each_job_and_escapes_names(redis_url, conn, qname):
    hostile = emqfast.Queue(qname + '"><img src=x onerror=alert(1)>', conn)
    q = emqfast.Queue(qname, conn)
    up = hostile.enqueue("up", delay_ms=3_600_000)
    mine = q.enqueue("mine", depends_on=[(hostile.name, up.id)])
    after = q.enqueue("after", depends_on=[mine])
    with TestClient(create_app(redis_url)) as c:
        page = c.get("/job", params={"q": qname, "id": mine.id}).text
    svg = re.search(r'<svg class="flow".*?</svg>', page, re.S).group(0)
    nodes = re.findall(r'<a href="([^"]+)" class="node st-(\w+)( here)?">', svg)
    assert len(nodes) == 3 and len(re.findall(r'<path class="edge', svg)) == 2
    hrefs = {html.unescape(h): (state, bool(here)) for h, state, here in nodes}
    assert hrefs[f"/job?q={qname}&id={mine.id}"] == ("waiting_deps", True)
    assert hrefs[f"/job?q={qname}&id={after.id}"] == ("waiting_deps", False)
    assert ("scheduled", False) in hrefs.values()  # the hostile queue's job, by its state
    assert "<img" not in page and "&lt;img src=x" in svg
