"""Log forging: job ids and error messages reach ``emqfast.*`` log messages escaped
(``%r``), so a newline cannot write a line of its own and ESC/BEL never go out raw;
the exact values stay in the records' ``extra`` fields (``job_id``, ``error``)."""
from __future__ import annotations

import json
import logging

from emqfast import Queue, Worker

FORGED = "\n12:00:00 WARNING emqfast.worker: job JOBadmin completed"
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x9b31m" + FORGED


def test_a_hostile_id_and_error_forge_no_log_line(r, qname, caplog):
    q = Queue(qname, r)
    bad_id = "JOBx" + HOSTILE  # no longer accepted as a new id: as a raw write left it
    r.hset(q.keys.job(bad_id), mapping={"payload": json.dumps({"n": 1}),
                                        "opts": json.dumps({"a": 1})})
    r.zadd(q.keys.pending, {bad_id: 1})
    r.zadd(q.keys.marker, {"0": 0})

    def handler(job):
        raise RuntimeError("boom" + HOSTILE)

    with caplog.at_level(logging.DEBUG, logger="emqfast"):
        Worker(q, handler).run_until_idle(timeout_s=30)
    records = [rec for rec in caplog.records if getattr(rec, "job_id", None) == bad_id]
    assert records, caplog.text
    for record in caplog.records:
        line = logging.Formatter("%(levelname)s %(name)s: %(message)s").format(record)
        assert "\n" not in line and "\x1b" not in line and "\x07" not in line \
            and "\x9b" not in line, line
    failure = next(rec for rec in records if getattr(rec, "error", None))
    assert failure.error == "RuntimeError: boom" + HOSTILE  # exact, for structured logs
    assert "\\n12:00:00 WARNING" in failure.getMessage()
