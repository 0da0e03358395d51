"""The dashboard's Workers page with a process Worker: each handler process (pid, jobs
run, RSS, the jobs it holds, linked) under the worker's row, and its child events in
words; a planted record's strings render as text."""
from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("starlette")
import emqfast  # noqa: E402
from emqfast.facade.workers import QueueWorkers  # noqa: E402
from emqfast.web import create_app  # noqa: E402
from emqfast.web.format import child_event, memory_kb  # noqa: E402
from procobs_handlers import handle  # noqa: E402
from test_procobs_workers import HOSTILE_CHILDREN, _plant  # noqa: E402
from test_web_pages import XSS_IMG, XSS_SCRIPT, text_of  # noqa: E402
from waiting import wait_until  # noqa: E402
from web_client import TestClient  # noqa: E402


@pytest.fixture
def busy(conn, qname, tmp_path) -> Iterator[Any]:
    """A process Worker (2 children) running one long job, listed with it in a child."""
    q = emqfast.Queue(qname, conn)
    mark = tmp_path / "began"
    job = q.enqueue({"k": "nap", "s": 30, "mark": str(mark)})
    w = emqfast.Worker(q, handle, processes=2, shutdown_timeout_s=0.5)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        wait_until(lambda: any(c.held for i in QueueWorkers(q).list() for c in i.children),
                   30, "the job in a child, in the heartbeat")
        yield w, job
    finally:
        w.stop()
        t.join(30)


def test_the_workers_page_shows_each_child(busy, redis_url, qname):
    w, job = busy
    with TestClient(create_app(redis_url, queues=[qname])) as c:
        page = c.get("/workers")
    assert page.status_code == 200
    text = " ".join(text_of(page.text).split())
    assert w.name in text and "process" in text
    assert "Child PID Jobs run RSS Jobs in hand" in text
    for child in w._children_report()["children"]:
        assert re.search(rf"\b{child['pid']} 0 \d+\.\d MB", text), (child, text)
    assert "idle" in text and "Child events: none yet" in text
    assert f'href="/job?q={qname}&amp;id={job.id}"' in page.text  # the job it runs, linked


def test_child_events_read_in_words(conn, redis_url, qname):
    _plant(conn, qname, "w1", {"kind": "process", "queues": qname, "children": "[]",
                               "child_events": '{"restarts":3,"kill:timeout":2,'
                                               '"recycled:memory":1,"crash":1}'})
    with TestClient(create_app(redis_url, queues=[qname])) as c:
        text = " ".join(text_of(c.get("/workers").text).split())
    assert ("Child events: crashed 1 · killed (timeout) 2 · recycled (memory) 1 · "
            "restarted 3") in text, text
    assert "No handler process listed." in text


@pytest.mark.parametrize("hostile", [XSS_SCRIPT, XSS_IMG])
def test_a_planted_record_renders_as_text(conn, redis_url, qname, hostile):
    children = HOSTILE_CHILDREN.replace("JOB", "JOB" + hostile.replace('"', '\\"'))
    _plant(conn, qname, "w" + hostile, {
        "kind": "process", "host": hostile, "queues": qname,
        "children": children, "child_events": '{"%s": 1}' % hostile.replace('"', '\\"')})
    with TestClient(create_app(redis_url, queues=[qname])) as c:
        page = c.get("/workers")
    assert page.status_code == 200
    assert hostile not in page.text  # escaped wherever it appears
    assert hostile in text_of(page.text)  # and still shown


def test_formatting_helpers():
    assert memory_kb(None) == "—" and memory_kb(812) == "812 KB"
    assert memory_kb(42_300) == "41.3 MB" and memory_kb(3 << 20) == "3.0 GB"
    assert child_event("kill:cancel") == "killed (cancel)" and child_event("new") == "new"
