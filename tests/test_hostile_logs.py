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


def test_emqfast_worker_prints_any_record_on_its_own_lines_only():
    """``emqfast worker``'s formatter: a message (any logger's) stays one line with its
    controls as escapes; a traceback keeps its lines but not its ESC/BEL."""
    import sys

    from emqfast.tools.cli_worker import FailureLines

    fmt = FailureLines()
    record = logging.LogRecord("some.lib", logging.INFO, __file__, 1, "saw %s", (HOSTILE,), None)
    line = fmt.format(record)
    assert "\n" not in line and "\x1b" not in line and "\\x0a12:00:00 WARNING" in line
    try:
        raise RuntimeError(HOSTILE)
    except RuntimeError:
        info = sys.exc_info()
    text = fmt.format(logging.LogRecord("x", logging.ERROR, __file__, 1, "oops", (), info))
    assert "Traceback (most recent call last):\n" in text
    assert "\x1b" not in text and "\x07" not in text and "\\x1b[2J" in text
    failure = logging.LogRecord("emqfast.worker", logging.WARNING, __file__, 1, "m", (), None)
    failure.error, failure.job_id, failure.final = "E: " + HOSTILE, "JOBx" + HOSTILE, True
    line = fmt.format(failure)
    assert "\n" not in line and "\x1b" not in line and "FAILED JOBx\\x1b[2J" in line
