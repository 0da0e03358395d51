"""The thread Worker's handler threads: at most ``size`` run at once, a task that raises
does not end its thread, and shutdown ends the idle ones (dropping tasks not begun when
asked to)."""
from __future__ import annotations

import threading
import time

import pytest

from emqfast.worker.handler_threads import HandlerThreads


def test_at_most_size_tasks_run_at_once_and_all_run():
    pool = HandlerThreads(3)
    lock, gate = threading.Lock(), threading.Event()
    running, peak, done = [0], [0], []

    def task(i: int) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        gate.wait(5)
        with lock:
            running[0] -= 1
            done.append(i)

    for i in range(10):
        pool.submit(task, i)
    time.sleep(0.1)
    assert peak[0] == 3
    gate.set()
    pool.shutdown(wait=True)
    assert sorted(done) == list(range(10))
    assert peak[0] == 3


def test_a_raising_task_leaves_its_thread_serving():
    pool = HandlerThreads(1)
    ran = threading.Event()

    def boom() -> None:
        raise ValueError("x")

    pool.submit(boom)
    pool.submit(ran.set)
    assert ran.wait(5)
    pool.shutdown(wait=True)


def test_shutdown_drops_tasks_not_begun_and_refuses_new_ones():
    pool = HandlerThreads(1)
    gate, ran = threading.Event(), []
    pool.submit(gate.wait, 5)
    time.sleep(0.05)
    for i in range(5):
        pool.submit(ran.append, i)
    pool.shutdown(wait=False, cancel_futures=True)
    gate.set()
    pool.shutdown(wait=True)
    assert ran == []
    with pytest.raises(RuntimeError):
        pool.submit(ran.append, 9)
    assert not [t for t in threading.enumerate() if t.name.startswith("emq-handler_")
                and t.is_alive() and t in pool._threads]
