"""The package's type hints are part of its contract: ``mypy`` with the
strict config in pyproject.toml passes on ``emqfast`` (the modules not yet clean are
listed there with ``ignore_errors``), and a user's checker sees what an operation
returns, not ``Any``: ``reveal_type(Queue(...).enqueue(...))`` is ``JobRef``."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mypy", reason="mypy is in the test extra")

USER_CODE = '''
import emqfast.aio
from emqfast import Leaderboard, Queue

q = Queue("typed")
reveal_type(q.enqueue({"n": 1}))
reveal_type(q.enqueue_many([1, 2]))
reveal_type(q.counts())
reveal_type(Leaderboard(None, "board").top(3))


async def produce() -> None:
    aq = emqfast.aio.Queue("typed")
    reveal_type(aq.enqueue({"n": 1}))
    ref = await aq.enqueue({"n": 1})
    reveal_type(ref)
    await aq.schedules.count()  # a queue's parts are awaited as the queue is
    reveal_type(await emqfast.aio.Leaderboard(None, "board").top(3))
    q.schedules.count()
'''


def mypy(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run mypy from the repo root (pyproject.toml's [tool.mypy] applies)."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for the module: the second run reuses the package's analysis."""
    return tmp_path_factory.mktemp("mypy_cache")


def test_mypy_strict_passes_on_the_package(cache: Path) -> None:
    done = mypy(cache, "emqfast")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout


def revealed(output: str) -> List[str]:
    return re.findall(r'note: Revealed type is "([^"]+)"', output)


def test_a_checker_sees_what_operations_return(cache: Path, tmp_path: Path) -> None:
    snippet = tmp_path / "user_code.py"
    snippet.write_text(USER_CODE)
    done = mypy(cache, str(snippet))
    types = revealed(done.stdout)
    assert len(types) == 7, done.stdout + done.stderr
    assert types[0] == "emqfast.facade.job.JobRef"
    assert types[1] in ("list[emqfast.facade.job.JobRef]",
                        "builtins.list[emqfast.facade.job.JobRef]")
    assert types[2] in ("dict[str, int]", "builtins.dict[builtins.str, builtins.int]")
    assert "emqfast.facade.leaderboard.Entry" in types[3]
    # the asyncio facade's operations are awaitables of the same results
    assert types[4] == "typing.Awaitable[emqfast.facade.job.JobRef]"
    assert types[5] == "emqfast.facade.job.JobRef"
    assert "emqfast.facade.leaderboard.Entry" in types[6]
    # reveal_type is only a note: the snippet is clean under the strict config (the
    # package's own errors, if any, are the test above's to report)
    errors = [line for line in done.stdout.splitlines()
              if line.startswith(str(snippet)) and ": error:" in line]
    assert not errors, done.stdout


def test_a_users_script_sees_precise_types_under_strict(cache: Path) -> None:
    """tests/typing/user_script.py pins what the public API returns with ``assert_type``
    (schedules and groups of both facades, a Worker's stats by queue, ...): ``Any`` where
    emqfast knows the type fails it, as does any error a strict user would meet."""
    done = mypy(cache, "--strict", str(ROOT / "tests" / "typing" / "user_script.py"))
    assert done.returncode == 0, done.stdout + done.stderr
