"""``emqfast jobs QUEUE JOB`` on a big job: the table shows a capped
preview and the payload's size; ``--full`` prints everything; ``--json`` stays whole."""
from __future__ import annotations

import json

from emqfast import Queue
from emqfast.core.codec import DEFAULT_MAX_PAYLOAD_BYTES
from emqfast.tools.render import PREVIEW_CHARS, fmt_size, preview

from test_cli import emq

BIG = 20_000_000  # the 20 MB payload


def test_big_payload_shows_a_preview_with_its_size(redis_url, r, qname):
    q = Queue(qname, r)
    ref = q.enqueue({"blob": "x" * BIG})
    out = emq("--url", redis_url, "jobs", qname, ref.id, timeout=60)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout) < 20 * PREVIEW_CHARS  # not the 20 MB the issue saw printed
    assert "--full prints everything" in out.stdout
    stored = r.hstrlen(q.keys.job(ref.id), "payload")
    assert f"{stored:,} bytes" in out.stdout and "19.1 MB" in out.stdout


def test_full_prints_the_whole_payload(redis_url, r, qname):
    q = Queue(qname, r)
    ref = q.enqueue({"blob": "y" * BIG})
    out = emq("--url", redis_url, "jobs", qname, ref.id, "--full", timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--- payload (" in out.stdout
    assert json.dumps({"blob": "y" * BIG}) in out.stdout


def test_json_stays_whole_and_small_jobs_are_uncut(redis_url, r, qname):
    q = Queue(qname, r)
    big = q.enqueue({"blob": "z" * 50_000})
    out = emq("--url", redis_url, "jobs", qname, big.id, "--json")
    assert json.loads(out.stdout)["payload"] == {"blob": "z" * 50_000}
    small = q.enqueue({"to": "ada@example.com"})
    out = emq("--url", redis_url, "jobs", qname, small.id)
    assert "ada@example.com" in out.stdout and "more characters" not in out.stdout


def test_missing_job_is_one_line(redis_url, r, qname):
    Queue(qname, r).enqueue({})  # the queue exists; the job does not
    out = emq("--url", redis_url, "jobs", qname, "JOBnope")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [f"no job JOBnope in {qname} (never enqueued, or trimmed)"]


def test_preview_and_size_helpers():
    assert preview("a" * 10, 10) == "a" * 10
    assert preview("a" * 11, 10).startswith("a" * 10 + "… [1 more characters")
    assert fmt_size(850) == "850 B" and fmt_size(20 * 2**20) == "20.0 MB"
    assert DEFAULT_MAX_PAYLOAD_BYTES == 64 << 20  # the documented cap
