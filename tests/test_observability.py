"""Observability: the events stream, job.progress, metrics in Redis + Prometheus export,
the ``emqfast metrics`` CLI/HTTP endpoint, and log records with job context."""
from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import redis
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

import emqfast
import emqfast.aio as emq
from emqfast import Backoff
from emqfast.facade import metrics
from emqfast.backends import scripts
from emqfast.worker import calls as worker_core
from emqfast.tools.cli import cli
from emqfast.core.errors import InvalidInput, LeaseLost, PayloadError, RangeError
from conftest import _free_port, dump_queue
from engine_util import claim, complete, fail, make_queue, release, wait_server_past
from waiting import wait_until

NO_WAIT = Backoff.fixed(0)


def _names_for(q: emqfast.Queue, job_id: str):
    return [(e.name, e.attempt) for e in q.events() if e.job_id == job_id]


def test_events_follow_a_jobs_life(redis_url, qname, backend):
    q = make_queue(redis_url, qname)
    ref = q.enqueue("x", attempts=2, backoff=NO_WAIT)

    def handler(job):
        job.progress({"pct": job.attempts * 50})
        if job.attempts == 1:
            raise ValueError("first try fails")
        return "ok"

    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    assert _names_for(q, ref.id) == [
        ("enqueued", None), ("active", 1), ("progress", None), ("retrying", 1),
        ("active", 2), ("progress", None), ("completed", 2)]
    by_name = {e.name: e for e in q.events() if e.job_id == ref.id}
    assert by_name["retrying"].error == "ValueError: first try fails"
    assert by_name["retrying"].delay_ms == 0
    assert by_name["progress"].value == {"pct": 100}  # the later one wins in the dict
    assert by_name["enqueued"].fields["state"] == "pending"
    assert q.get(ref.id).last_progress == {"pct": 100}


def test_events_of_promote_reap_cancel_retry_release(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    delayed = q.enqueue_in("d", 20)
    wait_server_past(r, q.get(delayed.id).run_at_ms)
    assert q.promote() == 1
    [(stale, _)] = claim(q, "zombie", lease_ms=50)
    assert stale == delayed.id
    wait_server_past(r, int(r.zscore(q.keys.active, stale)))
    assert q.reap(max_stalled=0) == (0, 1)  # stalled once, over the limit: failed
    q.retry(stale)
    [(again, token)] = claim(q, "w", lease_ms=10_000)
    assert release(q, again, token) == 1
    gone = q.enqueue_in("e", 60_000)
    assert q.cancel(gone.id)
    assert [n for n, _ in _names_for(q, stale)] == [
        "enqueued", "promoted", "active", "stalled", "failed", "retried", "active", "released"]
    assert [n for n, _ in _names_for(q, gone.id)] == ["enqueued", "cancelled"]
    failed = [e for e in q.events() if e.job_id == stale and e.name == "failed"]
    assert failed[0].error == "stalled"


def test_schedule_occurrences_emit_enqueued(redis_url, qname):
    q = make_queue(redis_url, qname)
    # anchored a little in the past: one slot is due now
    q.schedules.upsert("tick", every_ms=60_000, payload="t",
                       start_at_ms=q.server_time_ms() - 1000)
    q.schedules.sweep()
    minted = [e for e in q.events() if e.name == "enqueued"]
    assert len(minted) == 1 and minted[0].fields["schedule"] == "tick"
    assert q.get(minted[0].job_id) is not None


def test_events_iterate_from_a_position_and_block_for_new_ones(redis_url, qname):
    q = make_queue(redis_url, qname)
    first = q.enqueue("a")
    everything = list(q.events())
    assert [e.job_id for e in everything] == [first.id]
    second = q.enqueue("b")
    after = list(q.events(since=everything[-1].id))
    assert [e.job_id for e in after] == [second.id]
    assert list(q.events(since=after[-1].id)) == []  # non-blocking: ends at the stream's end

    # blocking: a reader waiting from "$" sees an event written after it started
    seen = []
    reader = threading.Thread(target=lambda: seen.extend(
        q.events(since="$", block_ms=1500, count=1)), daemon=True)
    reader.start()
    wait_until(lambda: any(c.get("cmd") == "xread" for c in q.redis.client_list()),
               what="reader blocked in XREAD")
    third = q.enqueue("c")
    wait_until(lambda: seen, what="blocked reader saw the event")
    assert seen[0].job_id == third.id and seen[0].name == "enqueued"
    reader.join(10)  # the next 1.5 s wait brings nothing, so the iteration ends
    assert not reader.is_alive()


def test_events_can_be_capped_or_turned_off(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.configure_events(0)
    q.enqueue_many(list(range(50)))
    assert r.exists(q.keys.events) == 0
    q.configure_events(100)
    # ids of different lengths (not minted together): one entry per job
    q.enqueue_many(list(range(2000)), job_ids=[f"JOBx{i}" for i in range(2000)])
    # MAXLEN ~ trims whole stream nodes (100 entries each by default): near the cap
    assert 100 <= r.xlen(q.keys.events) < 400
    # minted ids go 100 to an entry: the cap counts entries, so all 2,000 are kept
    q.configure_events(25)
    r.delete(q.keys.events)
    refs = q.enqueue_many(list(range(2000)))
    assert r.xlen(q.keys.events) == 20
    assert [e.job_id for e in q.events()] == [ref.id for ref in refs]


def test_bad_observability_input_writes_nothing(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue("x")
    before = dump_queue(r, qname)
    with pytest.raises(RangeError):
        q.configure_events(-1)
    with pytest.raises(InvalidInput):
        q.configure_events("10")
    with pytest.raises(InvalidInput):
        q.read_events("not-an-id")
    with pytest.raises(InvalidInput):
        list(q.events(since=5))
    configure = scripts.load("configure")
    with pytest.raises(InvalidInput):  # the Lua side refuses before writing, too
        configure(r, [q.keys.meta, q.keys.marker], [emqfast.KEYSPACE_VERSION,
                                                     "nonsense", 1])
    with pytest.raises(InvalidInput):
        configure(r, [q.keys.meta, q.keys.marker], [emqfast.KEYSPACE_VERSION,
                                                     "events", "-5"])
    assert dump_queue(r, qname) == before


def test_progress_is_lease_checked_and_json_only(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    ref = q.enqueue("x")
    [(job_id, token)] = claim(q, "w", lease_ms=10_000)
    call = worker_core.progress_call(q.keys, job_id, token, {"step": 1})
    assert call.script(r, call.keys, call.args) == 1
    assert q.get(ref.id).last_progress == {"step": 1}
    before = dump_queue(r, qname)
    with pytest.raises(LeaseLost):
        stolen = worker_core.progress_call(q.keys, job_id, "w:999", 5)
        stolen.script(r, stolen.keys, stolen.args)
    with pytest.raises(PayloadError):
        worker_core.progress_call(q.keys, job_id, token, object())
    assert dump_queue(r, qname) == before
    with pytest.raises(RuntimeError):
        q.get(ref.id).progress(1)  # not a running handler's job


def test_metrics_count_outcomes_and_latencies(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue_many(["ok"] * 5)
    q.enqueue("bad", attempts=2, backoff=NO_WAIT)

    def handler(job):
        time.sleep(0.03)  # the work being measured: every run lasts >= 30 ms
        if job.payload == "bad":
            raise RuntimeError("no")

    emqfast.Worker(q, handler, concurrency=2).run_until_idle(timeout_s=30)
    # and a stall: a zombie's lease runs out
    q.enqueue("z")
    [(stale, _)] = claim(q, "zombie", lease_ms=50)
    wait_server_past(r, int(r.zscore(q.keys.active, stale)))
    assert q.reap() == (1, 0)

    m = q.metrics()
    assert m.counters == {"completed": 5, "failed": 1, "retried": 1, "stalled": 1,
                          "expired": 0}
    runs = 5 + 2  # every finished run is timed, failed ones too
    assert m.run.count == runs and m.wait.count == runs
    assert dict(m.run.buckets)[25.0] == 0  # none shorter than the handler's 30 ms
    assert m.run.sum_ms >= 30 * runs
    counts = [n for _, n in m.run.buckets]
    assert counts == sorted(counts)  # cumulative
    assert m.states["pending"] == 1 and m.states["completed"] == 5


def test_bucket_field_picks_the_first_bound_at_or_above():
    # the rule the Lua used to apply: a time lands in the first bucket whose bound >= it
    assert metrics.bucket_field("run", 0) == "run:le:5"
    assert metrics.bucket_field("run", 5) == "run:le:5"
    assert metrics.bucket_field("wait", 6) == "wait:le:10"
    assert metrics.bucket_field("run", 1_800_000) == "run:le:1800000"
    assert metrics.bucket_field("run", 1_800_001) == "run:le:+Inf"
    obs = metrics.Observations()
    for ms in (3, 7, 7, -1):  # -1: a time the script could not know, skipped
        obs.observe("run", ms)
    assert obs.fields == {"run:le:5": 1, "run:le:10": 2, "run:sum": 17}


def test_scripts_called_directly_time_the_run_but_record_no_histogram(redis_url, qname, r):
    # histograms are the Worker's job (one metrics_add per ack batch); counters stay exact
    q = make_queue(redis_url, qname)
    q.enqueue_many(["a", "b"])
    [(done_id, done_token), (bad_id, bad_token)] = claim(q, "w", n=2, lease_ms=10_000)
    wait_ms, run_ms = complete(q, done_id, done_token)
    assert 0 <= wait_ms < 60_000 and 0 <= run_ms < 60_000
    flag, wait_ms, run_ms = fail(q, bad_id, bad_token)
    assert flag == 0 and 0 <= wait_ms < 60_000 and 0 <= run_ms < 60_000
    raw = {k.decode(): int(v) for k, v in r.hgetall(q.keys.metrics).items()}
    assert raw == {"completed": 1, "failed": 1}


def test_metrics_add_refuses_bad_input_and_writes_nothing(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue("x")
    add = scripts.load("metrics_add")
    keys, version = [q.keys.metrics, q.keys.meta], emqfast.KEYSPACE_VERSION
    before = dump_queue(r, qname)
    for args in ([version, "run:sum"],                 # odd pairs
                 [version, "completed", 5],            # a counter: the scripts' alone
                 [version, "run:le:7x", 1],            # not a bucket
                 [version, "run:sum", -3],             # negative
                 [version, "run:le:5", 1, "wait:sum", "1.5"]):  # one bad pair refuses all
        with pytest.raises(InvalidInput):
            add(r, keys, args)
    assert dump_queue(r, qname) == before
    assert add(r, keys, [version, "run:le:5", 2, "run:sum", 7, "wait:le:+Inf", 1]) == 3
    assert q.metrics().run.buckets[0] == (5.0, 2) and q.metrics().run.sum_ms == 7


def test_aio_worker_records_histograms(redis_url, qname):
    q = emq.Queue(qname, emq.connect(redis_url))

    async def drain():
        await q.enqueue_many(["a", "b", "c", "d"])
        return await emq.Worker(q, lambda job: None).run_until_idle(timeout_s=30)

    stats = asyncio.run(asyncio.wait_for(drain(), 60))
    assert stats.completed == 4
    m = emqfast.Queue(qname, redis.Redis.from_url(redis_url)).metrics()
    assert m.counters["completed"] == 4 and m.run.count == 4 and m.wait.count == 4


def _families(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_prometheus_exposition_matches_redis(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue_many(["a", "b", "c"])
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    samples = _families(metrics.exposition(r, [qname]))
    assert samples[("emqfast_jobs_total", (("outcome", "completed"), ("queue", qname)))] == 3
    assert samples[("emqfast_job_run_seconds_count", (("queue", qname),))] == 3
    assert samples[("emqfast_job_wait_seconds_bucket", (("le", "+Inf"), ("queue", qname)))] == 3
    assert samples[("emqfast_queue_jobs", (("queue", qname), ("state", "completed")))] == 3
    raw = r.hgetall(q.keys.metrics)
    assert samples[("emqfast_job_run_seconds_sum", (("queue", qname),))] == \
        pytest.approx(int(raw[b"run:sum"]) / 1000)


def test_cli_metrics_prints_and_serves(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue("a")
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    out = CliRunner().invoke(cli, ["--url", redis_url, "metrics", qname])
    assert out.exit_code == 0, out.output
    assert _families(out.output)[
        ("emqfast_jobs_total", (("outcome", "completed"), ("queue", qname)))] == 1

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "emqfast", "--url", redis_url, "metrics",
                             qname, "--serve", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def scrape():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    return resp.read().decode()
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()
                return None
        body = wait_until(scrape, timeout=30, interval=0.05, what="metrics endpoint up")
        assert _families(body)[
            ("emqfast_jobs_total", (("outcome", "completed"), ("queue", qname)))] == 1
    finally:
        proc.terminate()
        proc.wait(10)


def test_failures_are_logged_with_job_context_and_no_payload(redis_url, qname, caplog):
    q = make_queue(redis_url, qname)
    ref = q.enqueue({"password": "hunter2"}, attempts=1)

    def handler(job):
        raise RuntimeError("handler broke")

    with caplog.at_level(logging.INFO, logger="emqfast"):
        emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    records = [rec for rec in caplog.records if getattr(rec, "job_id", None) == ref.id]
    assert records, caplog.text
    assert (records[0].queue, records[0].attempt) == (qname, 1)
    assert "handler broke" in records[0].getMessage()
    assert "hunter2" not in caplog.text


def test_aio_events_and_progress(redis_url, qname):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        ref = await q.enqueue("x")

        async def handler(job):
            await job.progress_async(0.5)
            return 1

        await emq.Worker(q, handler).run_until_idle(timeout_s=30)
        names = [e.name async for e in q.events() if e.job_id == ref.id]
        job = await q.get(ref.id)
        m = await q.metrics()
        await q.aclose()
        return names, job, m

    names, job, m = asyncio.run(asyncio.wait_for(main(), 60))
    assert names == ["enqueued", "active", "progress", "completed"]
    assert job.last_progress == 0.5
    assert m.counters["completed"] == 1


def test_aio_worker_plain_handler_can_report_progress(redis_url, qname):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        ref = await q.enqueue("x")
        await emq.Worker(q, lambda job: job.progress([1, 2])).run_until_idle(timeout_s=30)
        job = await q.get(ref.id)
        await q.aclose()
        return job

    job = asyncio.run(asyncio.wait_for(main(), 60))
    assert job.state == "completed" and job.last_progress == [1, 2]


def test_blocking_reads_stay_under_the_clients_socket_timeout(redis_url, qname):
    """A wait longer than the client's socket timeout is a series of shorter server-side
    blocks, not a TimeoutError."""
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url, socket_timeout=0.3))
    q.enqueue("a")
    began = time.monotonic()
    got = list(q.events(block_ms=1000))
    assert [e.name for e in got] == ["enqueued"]
    assert time.monotonic() - began >= 1.0  # it did wait the whole second for more


def test_aio_coroutine_handler_is_told_to_await_progress(redis_url, qname):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        ref = await q.enqueue("x", attempts=1)

        async def handler(job):
            job.progress(1)  # the blocking form would stall the loop: refused

        await emq.Worker(q, handler).run_until_idle(timeout_s=30)
        job = await q.get(ref.id)
        await q.aclose()
        return job

    job = asyncio.run(asyncio.wait_for(main(), 60))
    assert job.state == "failed" and "progress_async" in job.error


@pytest.mark.parametrize("facade", ["sync", "aio"])
def test_worker_times_a_delayed_job_from_its_run_at(r, redis_url, qname, facade):
    """The Worker hands complete.lua the run as start.lua reported it: the recorded wait
    runs from the job's run-at (not its creation) to its start, the run from start to
    finish, exactly what the job hash says."""
    q = make_queue(redis_url, qname)
    ref = q.enqueue_in("x", 200)
    wait_server_past(r, q.get(ref.id).run_at_ms + 150)  # due 150+ ms before any worker
    if facade == "sync":
        emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    else:
        import asyncio

        async def drain() -> None:
            aq = emq.Queue(qname, emq.connect(redis_url))
            await emq.Worker(aq, lambda job: None).run_until_idle(timeout_s=30)
        asyncio.run(asyncio.wait_for(drain(), 60))
    job = q.get(ref.id)
    m = q.metrics()
    assert job.state == "completed" and m.wait.count == 1 and m.run.count == 1
    assert m.wait.sum_ms == job.started_ms - job.run_at_ms >= 150
    assert m.wait.sum_ms < job.started_ms - job.created_ms  # not counted from creation
    assert m.run.sum_ms == job.finished_ms - job.started_ms
