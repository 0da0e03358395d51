"""Every ```python block of README.md runs as written.

A reader pastes the README's examples into a file and runs them: each block must end on
its own, with exit status 0, no traceback, and no handler failure it did not intend. The
blocks run in README order, each in its own process, against one private redis-server
(``EMQ_REDIS_URL``) so queues left by one block are what the next one meets, as on a
reader's machine. Logging is set to INFO in the runner so that even retried failures
(logged at INFO, invisible in a plain script) fail the test.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import pytest

from conftest import start_redis_server

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 120  # per block; the slowest (10,000 jobs through a Worker) takes seconds

# Logs at INFO, then runs the block as a script (as `python block.py` would).
RUNNER = ("import logging, runpy, sys; "
          "logging.basicConfig(level=logging.INFO, stream=sys.stderr, "
          "format='%(levelname)s %(name)s: %(message)s'); "
          "runpy.run_path(sys.argv[1], run_name='__main__')")

# What a handler failure (or any other trouble) looks like in the block's stderr.
TROUBLE = re.compile(r"Traceback|^(WARNING|ERROR|CRITICAL) |\bwill retry \(|\bfailed \(queue",
                     re.MULTILINE)


def python_blocks(markdown: str) -> List[str]:
    """The ```python fenced blocks of a Markdown text, dedented (a block may sit indented
    inside a list item)."""
    blocks = []
    for m in re.finditer(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```[ \t]*$", markdown,
                         re.MULTILINE | re.DOTALL):
        blocks.append(textwrap.dedent(m.group(2)))
    return blocks


BLOCKS = python_blocks((REPO / "README.md").read_text(encoding="utf-8"))


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 3, "README.md lost its ```python examples?"


@pytest.fixture(scope="module")
def private_redis_url():
    """A redis-server of this module's own: README examples use fixed queue names."""
    proc, port, workdir = start_redis_server()
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=lambda i: f"block{i + 1}")
def test_readme_python_block_runs_as_written(index, private_redis_url, tmp_path):
    source = BLOCKS[index]
    script = tmp_path / f"readme_block_{index + 1}.py"
    script.write_text(source, encoding="utf-8")
    env = dict(os.environ, EMQ_REDIS_URL=private_redis_url,
               EMQ_STATE_DIR=str(tmp_path / "state"),  # never the reader's embedded Redis
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")])))
    try:
        out = subprocess.run([sys.executable, "-c", RUNNER, str(script)], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"README block {index + 1} still ran after {DEADLINE_S}s (a worker "
                    f"that never ends?):\n{source}\n--- stderr:\n{exc.stderr}")
    shown = f"README block {index + 1}:\n{source}\n--- stdout:\n{out.stdout}\n" \
            f"--- stderr:\n{out.stderr}"
    assert out.returncode == 0, shown
    assert not TROUBLE.search(out.stderr), shown
