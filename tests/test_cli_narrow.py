"""The CLI on an 80-column terminal and at a newcomer's first typo: job ids are never cut
(each can be copied back into ``jobs QUEUE ID``, ``retry``, ``cancel``), every column has
its header, times carry their date when it is not today, a queue that does not exist is
said to be missing (with close names), queue names and ``--help`` lines are never cut or
broken mid-word, and the dashboard stops on Ctrl-C without an error."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from emqfast import Queue, Worker

from test_cli import cli_env, emq
from test_hostile_cli import assert_nothing_raw, on_a_terminal

ID = re.compile(r"JOB[0-9A-Za-z_-]+")
FAR = 1_904_000_000_000  # 2030-05-03 UTC: a job due years from now
COMMANDS = ("", "demo", "stats", "jobs", "enqueue", "retry", "cancel", "schedules", "worker",
            "workers", "bench", "metrics", "server", "server start", "server status",
            "server stop", "server wipe", "dashboard")


def narrow(*args: str) -> subprocess.CompletedProcess:
    """``emqfast ARGS`` as an 80-column terminal would lay it out."""
    return emq(*args, env=cli_env(COLUMNS="80"))


def _failing(job):
    raise RuntimeError("smtp said no: mailbox unavailable for the recipient")


@pytest.fixture
def mixed(r, qname):
    """Jobs in most states, with minted ids: due in an hour and in 2030, waiting, done,
    failed."""
    q = Queue(qname, r)
    failed = q.enqueue({"n": 0}, attempts=1)
    Worker(q, _failing).run_until_idle(timeout_s=30)
    q.enqueue_many([{"n": 1}, {"n": 2}], priority=7)
    q.enqueue_in({"n": 3}, 3_600_000)
    q.enqueue_at({"n": 4}, FAR)
    return q, failed.id


def _every_id(q: Queue) -> list:
    return [i for state in ("scheduled", "pending", "failed") for i in q.job_ids(state)]


# --- job ids are never cut; every column has a header -----------------------------------

def test_jobs_at_80_columns_shows_every_id_whole(redis_url, mixed, qname):
    q, failed = mixed
    out = narrow("--url", redis_url, "jobs", qname)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), out.stdout
    for job_id in _every_id(q):
        assert job_id in ID.findall(out.stdout), (job_id, out.stdout)
    header = next(line for line in lines if line.split()[:1] == ["id"])
    assert header.split() == ["id", "state", "tries", "when", "error"], header
    row = next(line for line in lines if line.startswith(failed)).split()
    assert row[1:3] == ["failed", "1/1"] and "RuntimeError:" in row
    # an id read off the screen goes back into the CLI as it is
    copied = ID.findall(lines[lines.index(header) + 2])[0]
    assert emq("--url", redis_url, "jobs", qname, copied).returncode == 0


def test_jobs_on_an_80_column_terminal_cuts_no_id(redis_url, mixed, qname):
    q, _ = mixed
    code, out = on_a_terminal("--url", redis_url, "jobs", qname, columns=80)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.decode())
    assert code == 0 and "…" not in text.split("error")[0], text
    for job_id in _every_id(q):
        assert job_id in text, (job_id, text)


def test_output_wide_shows_every_column_and_date(redis_url, mixed, qname):
    q, failed = mixed
    out = narrow("--url", redis_url, "jobs", qname, "-o", "wide")
    assert out.returncode == 0, out.stderr
    header = next(line for line in out.stdout.splitlines() if "┃ id " in line)
    assert [c.strip() for c in header.split("┃")[1:-1]] == \
        ["id", "state", "attempts", "prio", "created", "run at", "finished", "error"]
    for job_id in _every_id(q):
        assert job_id in out.stdout
    assert "2030-05-03" in out.stdout and "smtp said no: mailbox unavailable" in out.stdout
    # --json is the same with or without -o
    assert emq("--url", redis_url, "jobs", qname, "--json").stdout == \
        emq("--url", redis_url, "jobs", qname, "--json", "-o", "wide").stdout


# --- times carry their date when it is not today ----------------------------------------

def test_time_helpers_say_the_date_when_it_is_not_today():
    from emqfast.tools.render import fmt_relative, fmt_when

    now = 1_796_428_800_000  # 2026-12-05 00:00:00 UTC
    assert fmt_when(now + 3_600_000, now) == "01:00:00"
    assert fmt_when(now + 86_400_000 + 1, now) == "2026-12-06 00:00:00"
    assert fmt_when(FAR, now) == "2030-05-03 00:53:20"
    assert fmt_when(None, now) == "-"
    assert fmt_relative(now + 2 * 3_600_000, now) == "in 2 h"
    assert fmt_relative(now - 180_000, now) == "3 min ago"
    assert fmt_relative(now + 26 * 3_600_000, now) == "in 26 h"


def test_jobs_and_stats_show_the_date_of_a_job_due_in_2030(redis_url, r, qname):
    q = Queue(qname, r)
    q.enqueue_at({"n": 1}, FAR)
    jobs = narrow("--url", redis_url, "jobs", qname)
    assert jobs.returncode == 0 and "2030-05-03" in jobs.stdout, jobs.stdout
    stats = narrow("--url", redis_url, "stats", qname)
    assert stats.returncode == 0 and "2030-05-03 00:53:20 (in " in stats.stdout, stats.stdout
    soon = Queue(qname + "-soon", r)
    soon.enqueue_in({"n": 2}, 2 * 3_600_000)
    out = narrow("--url", redis_url, "jobs", soon.name)
    assert re.search(r"scheduled\s+0/3\s+in 2 h", out.stdout), out.stdout


# --- a queue that does not exist --------------------------------------------------------

@pytest.mark.parametrize("args", [("stats", "{typo}"), ("jobs", "{typo}"),
                                  ("jobs", "{typo}", "--json"), ("schedules", "{typo}"),
                                  ("schedules", "{typo}", "remove", "digest"),
                                  ("retry", "{typo}", "--all"),
                                  ("cancel", "{typo}", "JOBx"),
                                  ("stats", "{typo}", "--watch", "--count", "1")])
def test_a_queue_that_does_not_exist_is_said_with_close_names(redis_url, r, qname, args):
    q = Queue(qname + "-mail", r)
    q.enqueue({"to": "ada"})
    typo = qname + "-mial"
    out = emq("--url", redis_url, *(a.format(typo=typo) for a in args))
    assert out.returncode == 1, out
    assert out.stdout == "", out.stdout
    assert out.stderr.startswith(f"no queue {typo} on redis://"), out.stderr
    assert f"did you mean {q.name}" in out.stderr and len(out.stderr.splitlines()) == 1
    assert not r.exists(f"emq:{{{typo}}}:meta")  # reading it wrote nothing


def test_removing_a_schedule_that_does_not_exist_fails_naming_close_ones(redis_url, r, qname):
    Queue(qname, r).schedules.upsert("digest", every_ms=60_000, payload={})
    out = emq("--url", redis_url, "schedules", qname, "remove", "digets")
    assert out.returncode == 1 and "no schedule digets" in out.stderr
    assert "did you mean digest?" in out.stderr


# --- stats: whole queue names at 80 columns, a plain layout into a pipe -----------------

@pytest.mark.parametrize("suffix", ["-notifications", "-notifications-for-the-course-team"])
def test_stats_at_80_columns_never_breaks_a_queue_name(redis_url, r, qname, suffix):
    q = Queue(qname + suffix, r)
    q.enqueue({"n": 1})
    q.enqueue_at({"n": 2}, FAR)
    out = narrow("--url", redis_url, "stats", q.name)
    assert out.returncode == 0, out.stderr
    assert all(len(line) <= 80 for line in out.stdout.splitlines()), out.stdout
    assert "…" not in out.stdout
    named = [line for line in out.stdout.splitlines() if q.name in line]
    assert named and all(re.search(rf"(^|\s){re.escape(q.name)}(\s|$)", line)
                         for line in named), out.stdout
    for header in ("scheduled", "pending", "waiting_deps", "paused", "next due", "schedules"):
        assert header in out.stdout, header


def test_stats_into_a_pipe_is_one_plain_line_per_queue(redis_url, r, qname):
    Queue(qname, r).enqueue({"n": 1})
    out = emq("--url", redis_url, "stats")  # no terminal, no COLUMNS
    assert out.returncode == 0, out.stderr
    mine = [line for line in out.stdout.splitlines() if f" queue={qname} " in line]
    assert len(mine) == 1 and " pending=1 " in mine[0] and "│" not in out.stdout
    fields = dict(part.split("=", 1) for part in mine[0].split(" ") if "=" in part)
    assert fields["scheduled"] == "0" and fields["paused"] == "no"


# --- --help at 80 columns ---------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
def test_help_at_80_columns_cuts_nothing(command):
    out = narrow(*command.split(), "--help")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), out.stdout  # a terminal would break it
    listed = lines[lines.index("Commands:") + 1:] if "Commands:" in lines else []
    assert listed == [] or all(not line.rstrip().endswith(("...", "…")) for line in listed), \
        out.stdout


# --- the dashboard stops on Ctrl-C ------------------------------------------------------

def test_dashboard_ctrl_c_exits_0_quietly(redis_url):
    pytest.importorskip("uvicorn")
    proc = subprocess.Popen([sys.executable, "-m", "emqfast", "dashboard", "--url", redis_url,
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env())
    try:
        assert "emqfast dashboard on http://" in proc.stdout.readline()
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Aborted" not in out + err and "Traceback" not in err, err


# --- stored strings stay text in the narrow layouts --------------------------------------

def test_hostile_names_stay_text_in_the_narrow_layouts(redis_url, r, qname):
    q = Queue(qname + "[/]\u00e9-notifications-for-the-course-team", r)
    q.enqueue({"n": 1}, job_id="JOB[link=//evil.example]x[/link]")
    for args in (("stats", q.name), ("jobs", q.name), ("jobs", q.name, "-o", "wide")):
        code, out = on_a_terminal("--url", redis_url, *args, columns=80)
        assert code == 0 and b"\x1b]8;" not in out, (args, out)
        assert_nothing_raw(out)
        assert q.name.encode() in out.replace(b"\r\n", b""), (args, out)
