"""The ``emqfast`` CLI, run as real subprocesses against a real Redis."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from emqfast import Queue, Worker
from emqfast.tools.render import fmt_ms

from conftest import dump_queue, start_redis_server
from waiting import wait_until

REPO = Path(__file__).resolve().parent.parent


def cli_env(**extra: str) -> dict:
    """The environment for a CLI subprocess: this checkout importable, no inherited URL."""
    env = {k: v for k, v in os.environ.items() if k != "EMQ_REDIS_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def emq(*args: str, env: dict | None = None, cwd: Path | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``python -m emqfast ARGS`` and capture its output."""
    return subprocess.run([sys.executable, "-m", "emqfast", *args], env=env or cli_env(),
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def cells(output: str, first: str) -> list:
    """The cells of the table row whose first cell is ``first``."""
    for line in output.splitlines():
        parts = [p.strip() for p in line.split("│")]
        if len(parts) > 2 and parts[1] == first:
            return parts[1:-1]
    raise AssertionError(f"no row {first!r} in:\n{output}")


def fail_flagged(job):
    if job.payload.get("fail"):
        raise RuntimeError(f"smtp said no to {job.payload['n']}")
    return {"sent": job.payload["n"]}


@pytest.fixture
def populated(r, qname):
    """A queue with 2 completed, 1 failed, 2 pending and 1 scheduled job."""
    q = Queue(qname, r)
    q.enqueue_many([{"n": 1}, {"n": 2}])
    failing = q.enqueue({"n": 3, "fail": True}, attempts=1)
    Worker(q, fail_flagged, concurrency=2).run_until_idle(timeout_s=30)
    q.enqueue_many([{"n": 4}, {"n": 5}], priority=7)
    q.enqueue_in({"n": 6}, 3_600_000)
    return q, failing.id


def test_stats_shows_counts_next_due_and_discovers_queues(redis_url, populated, qname):
    q, _ = populated
    out = emq("--url", redis_url, "stats", qname, env=cli_env(COLUMNS="200"))
    assert out.returncode == 0, out.stderr
    row = cells(out.stdout, qname)
    # scheduled pending grouped active completed failed
    # ... completed failed cancelled expired waiting_deps
    assert row[1:10] == ["1", "2", "0", "0", "2", "1", "0", "0", "0"]
    assert row[10] == "no"
    due = fmt_ms(q.next_due_ms(), date=False).split(".")[0]  # the table's time: seconds
    assert due in row[11] and "in " in row[11]

    everything = emq("stats", "--url", redis_url)  # --url after the command works too
    assert everything.returncode == 0, everything.stderr
    # piped: a plain key=value line per queue, as stats --watch writes into a pipe
    assert f"queue={qname} scheduled=1 pending=2 grouped=0 active=0 completed=2 failed=1 " \
        in everything.stdout


def test_stats_watch_refreshes_then_stops(redis_url, populated, qname):
    out = emq("--url", redis_url, "stats", qname, "--watch", "--interval", "0.1", "--count", "3")
    assert out.returncode == 0, out.stderr
    # piped: one plain line per refresh (the table is for terminals)
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and all(f"queue={qname} " in line for line in lines)
    assert all(" pending=2 " in line for line in lines) and out.stdout.endswith("\n")


def test_jobs_lists_and_inspects_failed_jobs(redis_url, populated, qname):
    q, failed_id = populated
    listed = emq("--url", redis_url, "jobs", qname, "--state", "failed", "--json")
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert [j["id"] for j in data] == [failed_id]
    assert data[0]["state"] == "failed" and data[0]["error"] == "RuntimeError: smtp said no to 3"

    table = emq("--url", redis_url, "jobs", qname, "--state", "failed")
    assert table.returncode == 0
    row = cells(table.stdout, failed_id)
    assert row[1] == "failed" and row[2] == "1/1" and "smtp said no to 3" in row[7]
    assert "JOB" not in table.stdout.replace(failed_id, "")  # only the failed job is listed

    detail = emq("--url", redis_url, "jobs", qname, failed_id)
    assert detail.returncode == 0
    assert "Traceback" in detail.stdout and "fail_flagged" in detail.stdout

    everything = json.loads(emq("--url", redis_url, "jobs", qname, "--json").stdout)
    assert sorted(j["state"] for j in everything) == \
        ["completed", "completed", "failed", "pending", "pending", "scheduled"]


def test_retry_and_cancel(redis_url, populated, qname, r):
    q, failed_id = populated
    out = emq("--url", redis_url, "retry", qname, failed_id)
    assert out.returncode == 0, out.stderr
    job = q.get(failed_id)
    assert job.state == "pending" and job.attempts == 0
    assert failed_id in q.job_ids("pending")

    again = emq("--url", redis_url, "retry", qname, failed_id)
    assert again.returncode == 1 and "JobStateError" in again.stderr
    assert "it is pending" in again.stderr  # names the state it is in

    scheduled = q.job_ids("scheduled")[0]
    out = emq("--url", redis_url, "cancel", qname, scheduled)
    assert out.returncode == 0, out.stderr
    # a cancelled job keeps a record
    assert q.get(scheduled).state == "cancelled" and q.counts()["scheduled"] == 0
    again = emq("--url", redis_url, "cancel", qname, scheduled)
    assert again.returncode == 1 and "cannot cancel" in again.stderr
    assert "it is cancelled already" in again.stderr  # says which case it was
    unknown = emq("--url", redis_url, "cancel", qname, "JOBnever-enqueued")
    assert unknown.returncode == 1 and "no such job" in unknown.stderr

    before = dump_queue(r, qname)
    bad = emq("--url", redis_url, "cancel", qname, "not-a-job-id")
    assert bad.returncode == 1 and "KindError" in bad.stderr
    bad = emq("--url", redis_url, "stats", "bad{name")
    assert bad.returncode == 1 and "InvalidInput" in bad.stderr
    assert dump_queue(r, qname) == before


HANDLER = textwrap.dedent('''
    import time

    def handle(job):
        if job.payload.get("slow"):
            time.sleep(0.6)
        return {"double": job.payload["n"] * 2}
''')


def test_worker_runs_an_importable_handler_and_stops_gracefully(redis_url, qname, tmp_path):
    (tmp_path / "portal_handlers.py").write_text(HANDLER)
    q = Queue(qname, redis_url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "emqfast", "--url", redis_url, "worker",
         "portal_handlers:handle", "--queue", qname, "--concurrency", "2"],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        refs = q.enqueue_many([{"n": i} for i in range(20)])
        wait_until(lambda: q.counts()["completed"] == 20, 20, "the worker process to run 20 jobs",
                   interval=0.05)
        assert [q.get(ref.id).result for ref in refs] == [{"double": 2 * i} for i in range(20)]

        slow = q.enqueue({"n": 21, "slow": True})
        wait_until(lambda: q.get(slow.id).state == "active", 20, "the slow job to start",
                   interval=0.05)
        proc.send_signal(signal.SIGTERM)  # in flight: a graceful stop lets it finish
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert q.get(slow.id).state == "completed" and q.get(slow.id).result == {"double": 42}
    assert "completed 21" in err


def test_worker_rejects_a_handler_it_cannot_import(redis_url, qname, tmp_path):
    out = emq("--url", redis_url, "worker", "no_such_module:handle", "--queue", qname,
              cwd=tmp_path)
    assert out.returncode == 2 and "cannot import 'no_such_module'" in out.stderr
    (tmp_path / "mod_without.py").write_text("x = 1\n")
    out = emq("--url", redis_url, "worker", "mod_without:handle", "--queue", qname, cwd=tmp_path)
    assert out.returncode == 2 and "has no attribute 'handle'" in out.stderr


def test_a_password_in_the_url_is_never_printed(qname, tmp_path):
    password = "Sup3r-Secret-Pw-4711"
    proc, port, workdir = start_redis_server()
    try:
        redis.Redis(port=port).config_set("requirepass", password)
        url = f"redis://:{password}@127.0.0.1:{port}/0"
        q = Queue(qname, redis.Redis.from_url(url))
        q.enqueue({"n": 1})
        runs = [
            emq("--url", url, "stats", env=cli_env(COLUMNS="200")),
            emq("--url", url, "stats", qname),
            emq("stats", qname, env=cli_env(EMQ_REDIS_URL=url, COLUMNS="200")),
            emq("--url", url, "jobs", qname),
            emq("--url", url.replace(password, password + "-wrong"), "stats"),
            emq("--url", url, "cancel", qname, "JOB-missing"),
            emq("--url", f"redis://:{password}@127.0.0.1:1/0", "stats"),  # nothing listens
        ]
        for out in runs:
            assert password not in out.stdout + out.stderr
        assert runs[0].returncode == 0 and f"redis://:***@127.0.0.1:{port}/0" in runs[0].stdout
        assert runs[2].returncode == 0 and "***" in runs[2].stdout
        assert runs[4].returncode == 1 and "error" in runs[4].stderr
        assert runs[6].returncode == 1 and "error" in runs[6].stderr
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def _run_main(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True,
                          text=True, timeout=60)


def test_bench_says_clearly_when_the_suite_is_absent():
    # None in sys.modules makes the import fail exactly as an absent package would
    out = _run_main("import sys; sys.modules['emqfast.bench'] = None; sys.modules['bench'] = None\n"
                    "from emqfast.tools.cli import main; main(['bench'])")
    assert out.returncode == 2
    assert "benchmark suite is not installed" in out.stderr


def test_bench_calls_the_suite_entry_point_with_its_arguments():
    out = _run_main("import sys, types\n"
                    "m = types.ModuleType('emqfast.bench.run')\n"
                    "m.main = lambda argv: print('BENCH', argv) or 3\n"
                    "sys.modules['emqfast.bench.run'] = m\n"
                    "from emqfast.tools.cli import main; main(['bench', '--quick', '-n', '5'])")
    assert out.returncode == 3, out.stderr
    assert "BENCH ['--quick', '-n', '5']" in out.stdout


def test_server_status_stop_wipe_on_the_embedded_redis(tmp_path):
    state = tmp_path / "state"
    env = cli_env(EMQ_STATE_DIR=str(state))
    try:
        out = emq("server", "status", env=env)
        assert out.returncode == 0 and re.search(r"running\s*│\s*False", out.stdout), out.stdout
        assert emq("stats", env=env).returncode == 0  # first use starts the embedded server
        out = emq("server", "status", env=env)
        assert re.search(r"running\s*│\s*True", out.stdout), out.stdout
        assert str(state) in out.stdout
        out = emq("server", "stop", env=env)
        assert out.returncode == 0 and "stopped" in out.stdout
        assert re.search(r"running\s*│\s*False", emq("server", "status", env=env).stdout)
        assert state.exists()
        out = emq("server", "wipe", "--yes", env=env)
        assert out.returncode == 0 and not state.exists()
    finally:
        emq("server", "wipe", "--yes", env=env)


def test_python_m_and_help():
    out = emq("--help")
    assert out.returncode == 0
    for command in ("demo", "stats", "jobs", "enqueue", "retry", "cancel", "schedules", "worker",
                    "bench", "server"):
        assert re.search(rf"^\s+{command}\s", out.stdout, re.M), command


def test_schedules_lists_next_runs_in_each_schedules_zone(redis_url, qname):
    from zoneinfo import ZoneInfo

    q = Queue(qname, redis_url)
    q.schedules.upsert("weekly-digest", cron="0 9 * * 1", tz="Europe/Paris",
                       payload={"kind": "digest"})
    q.schedules.upsert("tokyo-report", cron="30 18 * * *", tz="Asia/Tokyo", payload={})
    q.schedules.upsert("heartbeat", every_ms=60_000, payload={})
    out = emq("--url", redis_url, "schedules", qname)
    assert out.returncode == 0, out.stderr
    for name, zone, wall in (("weekly-digest", "Europe/Paris", "09:00:00.000"),
                             ("tokyo-report", "Asia/Tokyo", "18:30:00.000")):
        row = cells(out.stdout, name)
        assert row[2] == zone
        next_ms = q.schedules.get(name).next_run_ms
        assert row[3] == fmt_ms(next_ms, ZoneInfo(zone)) and wall in row[3]
    assert cells(out.stdout, "weekly-digest")[1] == "cron 0 9 * * 1"
    assert cells(out.stdout, "heartbeat")[1] == "every 1 min"

    stats = emq("--url", redis_url, "stats", qname, env=cli_env(COLUMNS="200"))
    assert cells(stats.stdout, qname)[12] == "3"  # schedules (after the state columns)
    assert cells(stats.stdout, "tokyo-report")[2] == "Asia/Tokyo"

    empty = emq("--url", redis_url, "schedules", qname + "-none")  # no such queue
    assert empty.returncode == 1 and f"no queue {qname}-none" in empty.stderr
    assert f"did you mean {qname}" in empty.stderr


# --- clear errors -------------------------------------------------------------------

@pytest.fixture
def locked_server():
    """A private redis-server with a password and an ACL user that may touch no key."""
    proc, port, workdir = start_redis_server()
    admin = redis.Redis(port=port)
    admin.acl_setuser("nokeys", enabled=True, passwords=["+nokeys-pw"], commands=["+@all"])
    admin.acl_setuser("noscripts", enabled=True, passwords=["+noscripts-pw"], keys=["emq:*"],
                      commands=["+@all", "-evalsha", "-eval", "-script"])
    admin.config_set("requirepass", "Sup3r-Secret-Pw-4711")
    admin.close()
    yield port
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.mark.parametrize("userinfo, says", [
    (":wrong-password@", "authentication failed: wrong user name or password"),
    ("nokeys:nokeys-pw@", "permission denied"),
    ("noscripts:noscripts-pw@", "permission denied"),
    ("", "requires a password and none was given"),
])
def test_worker_fails_fast_on_permanent_errors(locked_server, qname, tmp_path, userinfo, says):
    (tmp_path / "portal_handlers.py").write_text(HANDLER)
    url = f"redis://{userinfo}127.0.0.1:{locked_server}/0"
    for burst in ((), ("--burst",)):
        out = emq("--url", url, "worker", "portal_handlers:handle", "--queue", qname, *burst,
                  cwd=tmp_path, timeout=30)
        assert out.returncode == 1, out.stderr
        assert says in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert "retrying" not in out.stderr
    if userinfo.startswith("noscripts"):
        return  # stats reads without scripts: that user may run it
    out = emq("--url", url, "stats", qname)
    assert out.returncode == 1 and says in out.stderr and "Traceback" not in out.stderr
    if not userinfo:  # say how to pass one, not "HELLO must be called ..."
        assert "redis://:PASSWORD@HOST:PORT/0" in out.stderr and "HELLO" not in out.stderr


BROKEN_MODULES = {
    "bad_syntax": "def handle(job)\n    return 1\n",
    "raises_at_import": "raise RuntimeError('config missing: set PORTAL_TOKEN')\n",
}


@pytest.mark.parametrize("module", sorted(BROKEN_MODULES))
def test_a_handler_module_that_fails_to_import_is_one_clear_line(redis_url, qname, tmp_path,
                                                                  module):
    (tmp_path / f"{module}.py").write_text(BROKEN_MODULES[module])
    out = emq("--url", redis_url, "worker", f"{module}:handle", "--queue", qname, cwd=tmp_path)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert f"cannot import '{module}'" in out.stderr
    assert ("SyntaxError" if module == "bad_syntax" else "config missing") in out.stderr
    verbose = emq("--url", redis_url, "worker", f"{module}:handle", "--queue", qname, "-v",
                  cwd=tmp_path)
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr


def test_an_unbound_method_handler_is_refused_at_start(redis_url, qname, tmp_path):
    (tmp_path / "handlers_cls.py").write_text(textwrap.dedent("""
        class Portal:
            def handle(self, job):
                return 1

            @staticmethod
            def static(job):
                return 2

        portal = Portal()
    """))
    out = emq("--url", redis_url, "worker", "handlers_cls:Portal.handle", "--queue", qname,
              cwd=tmp_path)
    assert out.returncode == 2 and "is an instance method" in out.stderr, out.stderr
    q = Queue(qname, redis_url)
    q.enqueue("x")
    for spec in ("handlers_cls:Portal.static", "handlers_cls:portal.handle"):
        out = emq("--url", redis_url, "worker", spec, "--queue", qname, "--burst", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
    assert q.counts()["completed"] == 1 and q.counts()["failed"] == 0


def test_worker_refuses_an_evicting_server_unless_told_to_allow_it(qname, tmp_path):
    """A server that may evict keys would make jobs vanish: the CLI worker says so in one
    line and exits 1; --allow-eviction runs it anyway (and the job completes)."""
    (tmp_path / "portal_handlers.py").write_text(HANDLER)
    proc, port, workdir = start_redis_server(["--maxmemory", "64mb",
                                              "--maxmemory-policy", "allkeys-lru"])
    try:
        url = f"redis://127.0.0.1:{port}/0"
        q = Queue(qname, url)
        ref = q.enqueue({"n": 4})
        args = ("--url", url, "worker", "portal_handlers:handle", "--queue", qname, "--burst")
        out = emq(*args, cwd=tmp_path)
        assert out.returncode == 1, out.stderr
        assert "EvictionRisk" in out.stderr and "allkeys-lru" in out.stderr
        assert "--allow-eviction" in out.stderr
        assert "Traceback" not in out.stderr
        assert q.get(ref.id).state == "pending"

        out = emq(*args, "--allow-eviction", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert q.get(ref.id).state == "completed" and q.get(ref.id).result == {"double": 8}
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def test_server_start_is_idempotent_and_wipe_asks_unless_yes(tmp_path):
    state = tmp_path / "state"
    env = cli_env(EMQ_STATE_DIR=str(state))
    try:
        out = emq("server", "start", env=env)
        assert out.returncode == 0 and "started: unix://" in out.stdout, out.stdout + out.stderr
        url = out.stdout.split("started: ", 1)[1].strip()
        again = emq("server", "start", env=env)
        assert again.returncode == 0 and f"already running: {url}" in again.stdout, again.stdout
        assert redis.Redis.from_url(url).ping()

        refused = emq("server", "wipe", env=dict(env, COLUMNS="80"))  # no tty: say --yes
        assert refused.returncode == 1 and "pass --yes" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert state.exists() and redis.Redis.from_url(url).ping()

        out = emq("server", "wipe", "--yes", env=env)
        assert out.returncode == 0 and "wiped" in out.stdout and not state.exists()
    finally:
        emq("server", "wipe", "--yes", env=env)


def test_enqueue_one_job_from_json(redis_url, qname, r):
    q = Queue(qname, r)
    out = emq("--url", redis_url, "enqueue", qname, '{"to": "ada", "n": [1, 2]}')
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    job = q.get(job_id)
    assert job.state == "pending" and job.payload == {"to": "ada", "n": [1, 2]}

    out = emq("--url", redis_url, "enqueue", qname, "7", "--delay-ms", "3600000",
              "--priority", "3", "--job-id", "JOBcli-1")
    assert out.returncode == 0 and out.stdout.strip() == "JOBcli-1", out.stderr
    job = q.get("JOBcli-1")
    assert job.state == "scheduled" and job.payload == 7 and job.priority == 3

    dup = emq("--url", redis_url, "enqueue", qname, "8", "--job-id", "JOBcli-1")
    assert dup.returncode == 0 and "already exists" in dup.stderr
    assert q.get("JOBcli-1").payload == 7

    before = dump_queue(r, qname)
    bad = emq("--url", redis_url, "enqueue", qname, "{to: ada}", env=cli_env(COLUMNS="80"))
    assert bad.returncode == 1 and "invalid JSON payload" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and not bad.stdout
    bad = emq("--url", redis_url, "enqueue", qname, "1", "--job-id", "order-42")
    assert bad.returncode == 1 and bad.stderr.startswith("error: ")
    assert "Traceback" not in bad.stderr
    assert dump_queue(r, qname) == before


def test_retry_all_retries_every_failed_job_and_counts(redis_url, qname, r):
    q = Queue(qname, r)
    q.enqueue_many([{"n": i, "fail": True} for i in range(7)], attempts=1)
    q.enqueue({"n": 99})
    Worker(q, fail_flagged, concurrency=2).run_until_idle(timeout_s=30)
    assert q.counts()["failed"] == 7 and q.counts()["completed"] == 1

    from emqfast.tools.cli_jobs import retry_every
    assert retry_every(q, "failed", batch=3) == (7, 0)  # several bounded batches
    assert q.counts()["pending"] == 7 and q.counts()["failed"] == 0
    Worker(q, fail_flagged, concurrency=2).run_until_idle(timeout_s=30)

    out = emq("--url", redis_url, "retry", qname, "--all", "--state", "failed")
    assert out.returncode == 0 and "retried 7 failed jobs" in out.stdout, out.stdout + out.stderr
    assert q.counts()["pending"] == 7 and q.counts()["completed"] == 1
    out = emq("--url", redis_url, "retry", qname, "--all")
    assert out.returncode == 0 and "retried 0 failed jobs" in out.stdout

    both = emq("--url", redis_url, "retry", qname)
    assert both.returncode == 2 and "JOB_ID or --all" in both.stderr


def test_retry_all_steps_over_a_failed_id_whose_job_is_gone(r, qname):
    from emqfast.tools.cli_jobs import retry_every
    q = Queue(qname, r)
    q.enqueue_many([{"n": i, "fail": True} for i in range(4)], attempts=1)
    Worker(q, fail_flagged).run_until_idle(timeout_s=30)
    r.zadd(q.keys.failed, {"JOBghost": 2**50})  # listed first (newest), its hash gone
    assert retry_every(q, "failed", batch=2) == (4, 1)
    assert q.job_ids("failed") == ["JOBghost"] and q.counts()["pending"] == 4


def test_cancel_says_running_or_finished(redis_url, qname, r):
    q = Queue(qname, r)
    done = q.enqueue({"n": 1})
    Worker(q, fail_flagged).run_until_idle(timeout_s=30)
    out = emq("--url", redis_url, "cancel", qname, done.id)
    assert out.returncode == 1 and "already finished (completed)" in out.stderr, out.stderr

    from engine_util import claim
    running = q.enqueue({"n": 2})
    held = claim(q, "w", lease_ms=60_000)  # as a worker does: active, not finished
    assert [job_id for job_id, _token in held] == [running.id]
    assert q.get(running.id).state == "active"
    out = emq("--url", redis_url, "cancel", qname, running.id)
    # a running job's worker is asked to stop it (it ends cancelled)
    assert out.returncode == 0 and "it is running" in out.stdout, out.stderr
    assert "cancel requested" in out.stdout and q.get(running.id).state == "active"


def test_schedules_remove_says_whether_it_existed(redis_url, qname, r):
    q = Queue(qname, r)
    q.schedules.upsert("digest", every_ms=60_000, payload={"kind": "digest"})
    q.schedules.upsert("reminder", every_ms=3_600_000, payload={"kind": "reminder"})
    out = emq("--url", redis_url, "schedules", qname, "remove", "digest")
    assert out.returncode == 0 and "removed schedule digest" in out.stdout, out.stderr
    assert [s.name for s in q.schedules.list()] == ["reminder"]
    again = emq("--url", redis_url, "schedules", qname, "remove", "digest")  # like cancel
    assert again.returncode == 1 and "no schedule digest" in again.stderr, again.stderr
    listed = emq("--url", redis_url, "schedules", qname)  # listing is unchanged
    assert listed.returncode == 0 and "reminder" in listed.stdout and "digest" not in listed.stdout


def test_server_wipe_on_a_terminal_asks_and_no_keeps_the_data(tmp_path):
    import pty

    state = tmp_path / "state"
    env = cli_env(EMQ_STATE_DIR=str(state))
    try:
        assert emq("server", "start", env=env).returncode == 0
        leader, follower = pty.openpty()
        with os.fdopen(leader, "wb", buffering=0) as keyboard:
            keyboard.write(b"n\n")  # answered before the question: the tty buffers it
            out = subprocess.run([sys.executable, "-m", "emqfast", "server", "wipe"], env=env,
                                 stdin=follower, capture_output=True, text=True, timeout=60)
        os.close(follower)
        assert "Delete every queue and job in" in out.stdout, out.stdout + out.stderr
        assert out.returncode == 1 and state.exists()
    finally:
        emq("server", "wipe", "--yes", env=env)
