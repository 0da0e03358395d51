"""docs/protocol.md is a working spec: its example, read from the page, enqueues
through raw EVALSHA exactly as written (the script expanded and loaded as the page says,
no emqfast code on the producer side), and a real emqfast Worker runs the job."""
from __future__ import annotations

import os
import re
import shlex

import redis

import emqfast
from emqfast.core import lua
from emqfast.core.version import KEYSPACE_VERSION

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "protocol.md")


def documented_call() -> list:
    """The redis-cli EVALSHA command of the page's marked example, as argv words."""
    text = open(DOC, encoding="utf-8").read()
    block = re.search(r"<!-- protocol-example -->\s*```sh\n(.*?)```", text, re.S).group(1)
    command = block.split("\n", 1)[1].replace("\\\n", " ")  # after the SCRIPT LOAD line
    words = shlex.split(command)
    assert words[:2] == ["redis-cli", "EVALSHA"] and words[2] == "$SHA", words[:3]
    return words[3:]


def expanded_by_hand() -> str:
    """lua/enqueue.lua with each ``--@include NAME`` line replaced by lua/includes/NAME.lua,
    as the page tells another language's client to do."""
    directory = os.path.join(ROOT, "lua")
    raw = open(os.path.join(directory, "enqueue.lua"), encoding="utf-8").read()
    return re.sub(r"^--@include (\w+)[ \t]*$",
                  lambda m: open(os.path.join(directory, "includes", m.group(1) + ".lua"),
                                 encoding="utf-8").read(), raw, flags=re.M)


def _lines(source: str) -> list:
    return [line for line in source.splitlines() if line.strip()]


def test_the_documented_example_enqueues_a_job_a_worker_runs(r, redis_url, qname):
    args = documented_call()
    numkeys = int(args[0])
    keys, argv = args[1:1 + numkeys], args[1 + numkeys:]
    assert numkeys == 7 and len(argv) == 9  # enqueue.lua's header: KEYS[1..7], ARGV[1..9]
    assert argv[7] == KEYSPACE_VERSION  # the page speaks today's keyspace
    # the page's recipe gives emqfast's script (up to blank lines: Redis hands out the SHA)
    assert _lines(expanded_by_hand()) == _lines(lua.read("enqueue").source)
    keys = [k.replace("{mail}", "{" + qname + "}") for k in keys]  # a queue of this test

    sha = r.script_load(expanded_by_hand())
    assert r.evalsha(sha, numkeys, *keys, *argv) == 1  # "It replies 1"
    assert r.evalsha(sha, numkeys, *keys, *argv) == 0  # a re-sent id writes nothing

    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    job = q.get(argv[0])
    assert (job.state, job.payload, job.priority, job.max_attempts) == \
        ("pending", {"to": "ada@example.com"}, 2, 5)
    seen = []

    def send(job):
        seen.append((job.id, job.payload, job.attempts))
        return {"sent": job.payload["to"]}

    stats = emqfast.Worker(q, send).run_until_idle(timeout_s=30)
    assert stats.completed == 1
    assert seen == [("JOB-ext-0001", {"to": "ada@example.com"}, 1)]
    assert q.get("JOB-ext-0001").result == {"sent": "ada@example.com"}


def test_a_delayed_and_a_bytes_job_as_documented(r, redis_url, qname):
    """Mode 'in', encoding 'b' and the empty (default) options, per the argument table."""
    keys = [f"emq:{{{qname}}}:{suffix}" for suffix in
            ("job:JOB-ext-bytes", "pending", "delayed", "marker", "meta", "counter", "events")]
    sha = r.script_load(expanded_by_hand())
    argv = ["JOB-ext-bytes", b"\x00\xffraw", "b", "", 0, "in", 60_000, KEYSPACE_VERSION, 1]
    assert r.evalsha(sha, 7, *keys, *argv) == 2  # scheduled
    job = emqfast.Queue(qname, redis.Redis.from_url(redis_url)).get("JOB-ext-bytes")
    assert (job.state, job.payload, job.max_attempts) == ("scheduled", b"\x00\xffraw", 3)
    assert r.hget(keys[0], "opts") is None  # '' = the defaults, stored as no field
