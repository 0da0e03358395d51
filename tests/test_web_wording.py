"""The dashboard's words: a bad ``state`` lists every state there is, and a missing
job's 404 says what really removes a job."""
from __future__ import annotations

import re

import pytest
import redis

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from web_client import TestClient  # noqa: E402

import emqfast  # noqa: E402
from emqfast.facade.job import STATES  # noqa: E402
from emqfast.web import create_app  # noqa: E402

@pytest.fixture
def conn(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


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
