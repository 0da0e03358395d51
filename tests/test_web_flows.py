"""The dashboard shows the dependency and expiry states: jobs waiting for their
dependencies get a tab before scheduled, and the kept records of expired jobs a tab after
cancelled."""
from __future__ import annotations

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from web_client import TestClient  # noqa: E402

import emqfast  # noqa: E402
from emqfast.web import create_app  # noqa: E402


def test_queue_page_lists_jobs_waiting_for_dependencies(redis_url, conn, qname):
    q = emqfast.Queue(qname, conn)
    first = q.enqueue("grade lesson 1", delay_ms=3_600_000)
    cert = q.enqueue("certificate", depends_on=[first])
    with TestClient(create_app(redis_url)) as c:
        page = c.get(f"/queue?q={qname}&state=waiting_deps")
        assert page.status_code == 200
        assert cert.id in page.text and first.id not in page.text
        tabs = page.text.index("waiting_deps"), page.text.index("scheduled"), \
            page.text.index("expired")
        assert tabs[0] < tabs[1] < tabs[2]
        job = c.get(f"/job?q={qname}&id={cert.id}")
        assert job.status_code == 200 and "waiting_deps" in job.text
