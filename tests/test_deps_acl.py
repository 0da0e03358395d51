"""Under the README's least-privilege ACL rule, dependencies and flows (enqueue,
links, the drain, the cascade, the repair) run as a user restricted to ``emq:*`` keys and
the documented commands, and nothing is refused; a user lacking a command a dependency
script writes with gets a typed PermissionDenied and the script writes nothing."""
from __future__ import annotations

import shutil

import pytest
import redis

import emqfast
from conftest import dump_queue, start_redis_server
from emqfast.facade import deps
from emqfast.facade.admission import Job
from lua_static import readme_least_privilege

OPTIONAL_COMMANDS: set = set()  # the README's rule is exactly what emqfast sends


@pytest.fixture
def acl_server():
    """A private redis-server with the restricted user; yields (admin client, port)."""
    proc, port, workdir = start_redis_server(["--user", "emquser", "on", ">emq-pw", "~emq:*",
                                              "resetchannels", *readme_least_privilege()])
    admin = redis.Redis(port=port)
    yield admin, port
    admin.close()
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)


def test_dependencies_and_flows_run_under_the_least_privilege_rule(acl_server, monkeypatch):
    admin, port = acl_server
    conn = emqfast.connect(f"redis://emquser:emq-pw@127.0.0.1:{port}/0")
    a, b = emqfast.Queue("acl-deps-a", conn), emqfast.Queue("acl-deps-b", conn)
    root = a.enqueue("root")
    bad = a.enqueue("bad", attempts=1)
    ok = b.enqueue("ok", depends_on=[root])
    doomed = b.enqueue("doomed", depends_on=[bad])
    after_doomed = a.enqueue("after", depends_on=[(b.name, doomed.id)])
    flow = emqfast.Flow(conn)
    first = flow.add(a, "first")
    flow.add(b, "second", after=[first])
    flow.enqueue()
    call = deps.write_call(a.keys, Job("JOB-unlinked", b'"u"', b"j"), b"", 0,
                           [(a.name, root.id)], "fail")  # a producer that died here
    assert call.script(conn, call.keys, call.args) == 1

    def handler(job):
        if job.payload == "bad":
            raise RuntimeError("bad")
        return job.dependency_results()
    monkeypatch.setattr(deps, "REPAIR_GRACE_MS", 0)
    for _ in range(2):
        for q in (a, b):
            emqfast.Worker(q, handler, lease_ms=1000).run_until_idle(30)
    assert b.get(ok.id).state == "completed"
    assert b.get(doomed.id).error == a.get(after_doomed.id).error == "dependency failed"
    assert a.get("JOB-unlinked").state == "completed"
    assert a.counts()["waiting_deps"] == b.counts()["waiting_deps"] == 0
    refused = {e.get("object") for e in admin.acl_log()}
    assert refused <= OPTIONAL_COMMANDS, refused
    conn.close()


def test_a_user_without_sadd_gets_a_typed_error_and_nothing_written(acl_server):
    admin, port = acl_server
    admin.execute_command("ACL", "SETUSER", "emquser", "-sadd")
    conn = emqfast.connect(f"redis://emquser:emq-pw@127.0.0.1:{port}/0")
    q = emqfast.Queue("acl-nosadd", conn)
    dep = q.enqueue("dep")
    before = dump_queue(admin, q.name)
    with pytest.raises(emqfast.PermissionDenied):
        q.enqueue("w", depends_on=[dep])
    assert dump_queue(admin, q.name) == before
    conn.close()
