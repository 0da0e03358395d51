"""``emqfast demo``: the whole scenario on the embedded Redis, as a user runs it."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from emqfast.tools import demo

REPO = Path(__file__).resolve().parent.parent

PARTS = ("1 · Lesson reminder", "2 · Weekly digest", "3 · Password reset",
         "4 · Failed send", "5 · Ranking", "6 · Certificate", "7 · Nudge")


def _env(state_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "EMQ_REDIS_URL"}  # the embedded default
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["EMQ_STATE_DIR"] = str(state_dir)
    return env


def _emq(env: dict, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "emqfast", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_demo_plays_every_part_on_the_embedded_redis_and_exits_0(tmp_path):
    env = _env(tmp_path / "state")
    try:
        first = _emq(env, "demo")
        assert first.returncode == 0, first.stdout + first.stderr
        out = first.stdout
        for part in PARTS:
            assert part in out, part
        assert "Time is compressed" in out and "server's clock" in out
        assert out.count("✓") == 8 and "✗" not in out
        assert "waiting_deps" in out and "ref.wait() woke" in out   # 6: depends_on + wait
        assert out.count("replaced") >= 2                           # 7: the debounce
        assert "All expectations held." in out
        assert "Europe/Paris" in out and "(Monday)" in out   # the weekly digest's next run
        assert "unix://" in out                              # it ran on the embedded server

        # the demo clears its own queue first, so it can be run again and again
        again = _emq(env, "demo", "--quiet")
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.count("✓") == 8 and "What ran" not in again.stdout

        stats = _emq(env, "stats", demo.QUEUE)  # the CLI sees what the demo left behind
        assert stats.returncode == 0 and demo.QUEUE in stats.stdout
    finally:
        wiped = _emq(env, "server", "wipe", "--yes")
    assert wiped.returncode == 0, wiped.stderr
    assert not (tmp_path / "state").exists()


@pytest.fixture
def sabotaged(monkeypatch, qname):
    """The scenario on its own queue and board, with a shorter day (still a real run)."""
    monkeypatch.setattr(demo, "QUEUE", qname)
    monkeypatch.setattr(demo, "BOARD", qname)
    monkeypatch.setattr(demo, "DAY_MS", 600)
    return monkeypatch


def test_demo_fails_when_an_expectation_does_not_hold(r, sabotaged):
    # the reset email no longer has precedence over the bulk mail: that check must fail
    sabotaged.setattr(demo, "RESET_PRIORITY", demo.BULK_PRIORITY + 1)
    console = Console(record=True, width=200, file=io.StringIO())
    assert demo.run_demo(r, console=console, quiet=True) is False
    lines = console.export_text().splitlines()
    assert [line for line in lines if "✗" in line] == \
        [line for line in lines if "reset email overtook the backlog" in line]
    assert sum("✓" in line for line in lines) == 7
    assert "Some expectations did not hold." in lines
