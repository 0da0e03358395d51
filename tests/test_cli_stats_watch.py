"""``emqfast stats`` where a newcomer points it: ``--watch`` into a file or a pipe
writes plain lines (some bytes, and a final newline), and at 80 columns every header is
whole (never cut to ``sche…``, ``pen…``)."""
from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

from emqfast import Queue

from test_cli import cli_env, emq


def _seed(r, qname):
    q = Queue(qname, r)
    q.enqueue_many([{"n": 1}, {"n": 2}])
    q.enqueue_in({"n": 3}, 3_600_000)
    q.cancel(q.enqueue({"n": 4}).id)
    return q


def test_watch_redirected_to_a_file_writes_lines(redis_url, r, qname, tmp_path):
    _seed(r, qname)
    path = tmp_path / "stats.log"
    with open(path, "w") as out:
        done = subprocess.run([sys.executable, "-m", "emqfast", "--url", redis_url, "stats",
                               qname, "--watch", "--interval", "0.05", "--count", "2"],
                              stdout=out, stderr=subprocess.PIPE, text=True, env=cli_env(),
                              timeout=60)
    assert done.returncode == 0, done.stderr
    text = path.read_text()
    lines = text.splitlines()
    assert len(lines) == 2 and text.endswith("\n")
    for line in lines:
        assert f"queue={qname} scheduled=1 pending=2 grouped=0 active=0 completed=0 " \
               "failed=0 cancelled=1 expired=0 waiting_deps=0 paused=no schedules=0 next_due=" in line


def test_watch_piped_with_count_ends_with_a_newline(redis_url, r, qname):
    _seed(r, qname)
    out = emq("--url", redis_url, "stats", qname, "--watch", "--interval", "0.05",
              "--count", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith("\n") and len(out.stdout.splitlines()) == 2


def test_stats_at_80_columns_has_whole_headers(redis_url, r, qname):
    _seed(r, qname)
    out = emq("--url", redis_url, "stats", qname, env=cli_env(COLUMNS="80"))
    assert out.returncode == 0, out.stderr
    _assert_fits_80(out.stdout, qname)


def _assert_fits_80(text: str, qname: str) -> None:
    assert "…" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    for header in ("scheduled", "pending", "grouped", "active", "completed", "failed",
                   "cancelled", "paused", "next due", "schedules"):
        assert header in text, (header, text)
    assert qname in text.replace("\n", "")


def test_watch_on_an_80_column_terminal(redis_url, r, qname):
    """A real pseudo-terminal of 80 columns: the live view's headers are whole too."""
    _seed(r, qname)
    main, child = pty.openpty()
    env = cli_env(COLUMNS="80", LINES="40", TERM="xterm")
    proc = subprocess.Popen([sys.executable, "-m", "emqfast", "--url", redis_url, "stats",
                             qname, "--watch", "--interval", "0.05", "--count", "2"],
                            stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    chunks = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1)
        if ready:
            try:
                data = os.read(main, 65536)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    assert proc.wait(30) == 0
    os.close(main)
    import re
    # a redraw moves the cursor up: each control sequence starts a fresh line here
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", b"".join(chunks).decode(errors="replace"))
    text = text.replace("\r", "")
    _assert_fits_80(text, qname)
