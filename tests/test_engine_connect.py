"""Engine contract: connect() takes a client, a URL or EMQ_REDIS_URL, and never lets a
password out in an error message."""
from __future__ import annotations

import shutil
import tempfile

import pytest
import redis

import emqfast
from conftest import _free_port, start_redis_server
from emqfast.server import embedded
from emqfast.core.redaction import redact
from emqfast.core.errors import ConnectionFailed, InvalidInput

SECRET = "S3cret-Pw-4711"


@pytest.fixture
def no_embedded(monkeypatch):
    """A state dir of our own: proves no embedded server gets started behind our back."""
    state = tempfile.mkdtemp(prefix="emq-c-")
    monkeypatch.setenv("EMQ_STATE_DIR", state)
    yield state
    embedded.stop()
    shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def locked_server():
    """A real redis-server that requires SECRET."""
    proc, port, workdir = start_redis_server()
    redis.Redis(port=port).config_set("requirepass", SECRET)
    yield port
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)


def _same_server(a: redis.Redis, b: redis.Redis) -> bool:
    return a.info("server")["run_id"] == b.info("server")["run_id"]


def test_an_existing_client_is_used_as_is(r, qname):
    assert emqfast.connect(r) is r
    q = emqfast.Queue(qname, r)
    assert q.redis is r
    ref = q.enqueue("x")
    assert r.exists(q.keys.job(ref.id))


def test_emq_redis_url_is_honoured(monkeypatch, r, redis_url, qname, no_embedded):
    monkeypatch.setenv("EMQ_REDIS_URL", redis_url)
    client = emqfast.connect()
    assert _same_server(client, r)
    q = emqfast.Queue(qname)  # no conn at all: the environment decides
    ref = q.enqueue("via env")
    assert emqfast.Queue(qname, r).get(ref.id).payload == "via env"
    assert not embedded.is_running()


def test_an_explicit_url_beats_the_environment(monkeypatch, r, redis_url, no_embedded):
    monkeypatch.setenv("EMQ_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    assert _same_server(emqfast.connect(redis_url), r)


def test_bad_connection_argument(no_embedded):
    with pytest.raises(InvalidInput):
        emqfast.Queue("q", 42)


@pytest.mark.parametrize("url", [
    f"redis://user:{SECRET}@127.0.0.1:notaport/0",
    f"redis://:{SECRET}@127.0.0.1:notaport/0",
    f"redis://:pre@{SECRET}@127.0.0.1:notaport/0",      # '@' inside the password
    f"redis://u:{SECRET}/x@127.0.0.1:notaport/0",      # '/' inside the password
    f"redis://127.0.0.1:notaport/0?password={SECRET}",  # redis-py's query form
    f"redis://u:{SECRET}@[::1/0",
])
def test_password_not_in_the_error_of_a_bad_url(url):
    with pytest.raises(ConnectionFailed) as info:
        emqfast.connect(url)
    text = str(info.value) + repr(info.value)
    assert SECRET not in text and "***" in text
    assert info.value.__cause__ is None  # not chained to an exception quoting the URL


def test_password_not_in_the_error_when_nothing_listens(qname):
    port = _free_port()
    q = emqfast.Queue(qname, f"redis://:{SECRET}@127.0.0.1:{port}/0")
    with pytest.raises(emqfast.errors.ConnectionFailed) as info:
        q.enqueue("x")
    assert SECRET not in str(info.value) + repr(info.value)


def test_password_not_in_the_error_when_it_is_wrong(locked_server, qname):
    wrong = SECRET + "-wrong"
    q = emqfast.Queue(qname, f"redis://:{wrong}@127.0.0.1:{locked_server}/0")
    with pytest.raises(emqfast.errors.PermissionDenied) as info:
        q.enqueue("x")
    assert wrong not in str(info.value) and SECRET not in str(info.value)
    good = emqfast.Queue(qname, f"redis://:{SECRET}@127.0.0.1:{locked_server}/0")
    assert good.get(good.enqueue("x").id).payload == "x"


def test_redact_masks_every_password_form():
    cases = {
        f"redis://:{SECRET}@h:1/0": "redis://:***@h:1/0",
        f"redis://user:{SECRET}@h:1/0": "redis://user:***@h:1/0",
        f"rediss://u:a@{SECRET}@h/0": "rediss://u:***@h/0",
        f"unix://:{SECRET}@/tmp/r.sock?db=1": "unix://:***@/tmp/r.sock?db=1",
        f"redis://h:1/0?db=2&password={SECRET}": "redis://h:1/0?db=2&password=***",
        f"redis+cluster://u:{SECRET}@h:7000": "redis+cluster://u:***@h:7000",
        "redis://h:1/0": "redis://h:1/0",
        "redis://user@h:1/0": "redis://user@h:1/0",
    }
    for url, expected in cases.items():
        assert redact(url) == expected
    two = f"failed redis://:{SECRET}@a:1/0 then redis://u:{SECRET}@b:2/0 (kept)"
    assert redact(two) == "failed redis://:***@a:1/0 then redis://u:***@b:2/0 (kept)"
