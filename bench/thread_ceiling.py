"""The ceiling of a C-level group commit for threads, measured on a bare model (no emqfast
code, no Redis): is ``16 threads x q.enqueue >= 0.5x enqueue_many`` reachable at all?

The model is the cheapest group commit a C core could run. Each producer thread calls
one C function per job with the GIL released (cffi API mode releases it). The first
caller with nothing in flight leads: it "sends" and waits for the reply without the GIL;
callers arriving meanwhile block on their own condition variable and go out together in
the next flush; each gets its outcome. The server's time is a busy wait on the leading
thread (``--call-us`` per call plus ``--job-us`` per job; the defaults are enqueue
scripts' measured server cost on this machine kind), standing for Redis busy on the
other core. The reference is the same server time in one call per 500 jobs, from one
thread (what ``enqueue_many`` costs the server; its client cost is left out, which only
flatters the threads).

Two hand-over rules: ``hand-on`` (a leader returns after its flush and wakes the first
waiter to lead the next: what emqfast.backends.gather does) and ``keep-leading`` (the
leader flushes until nobody waits: the cheapest, unfair to the leader). Per job both pay
one OS wake-up of a blocked thread and one GIL hand-off, with no Python work besides a
call; a real enqueue adds its own work under the GIL.

    python -m bench.thread_ceiling [--threads 16] [--n 16000] [--reps 3]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import threading
import time
from typing import Any, List, Optional, Sequence, Tuple

_CDEF = """
int gc_submit(int job);
int gc_many(int n);
void gc_config(int call_ns, int job_ns, int keep_leading);
long gc_flushes(void);
"""

_SOURCE = r"""
#include <pthread.h>
#include <time.h>
typedef struct W { int job, out, done; pthread_cond_t cv; struct W *next; } W;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int busy = 0, call_ns = 0, job_ns = 0, keep = 0;
static long flushes = 0;
static W *head = NULL, *tail = NULL;

static void server(long ns) {  /* Redis busy on another core: the leader waits */
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &b);
        if ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) >= ns) return;
    }
}
void gc_config(int c, int j, int k) { call_ns = c; job_ns = j; keep = k; }
long gc_flushes(void) { return flushes; }
int gc_many(int n) { server(call_ns + (long)job_ns * n); flushes++; return n; }

/* Tell each waiter of a flush its outcome (done = 1). */
static void finish(W *w) {
    while (w) { W *nx = w->next; w->out = w->job; w->done = 1;
                pthread_cond_signal(&w->cv); w = nx; }
}

int gc_submit(int job) {
    W me; me.job = job; me.done = 0; me.next = NULL;
    W *batch = NULL; int n = 1;
    pthread_mutex_lock(&mu);
    if (busy) {
        pthread_cond_init(&me.cv, NULL);
        if (tail) tail->next = &me; else head = &me;
        tail = &me;
        while (!me.done) pthread_cond_wait(&me.cv, &mu);
        pthread_cond_destroy(&me.cv);
        if (me.done == 1) { pthread_mutex_unlock(&mu); return me.out; }
        batch = &me; n = 0;  /* done == 2: lead the waiters, me first */
        for (W *w = batch; w; w = w->next) n++;
    } else {
        busy = 1;
    }
    for (;;) {
        pthread_mutex_unlock(&mu);
        server(call_ns + (long)job_ns * n);
        pthread_mutex_lock(&mu);
        flushes++;
        finish(batch && batch == &me ? me.next : batch);
        W *next = head; head = tail = NULL;
        if (!next) { busy = 0; break; }
        if (!keep) { next->done = 2; pthread_cond_signal(&next->cv); break; }
        batch = next; n = 0;
        for (W *w = batch; w; w = w->next) n++;
    }
    pthread_mutex_unlock(&mu);
    return job;
}
"""


def build() -> Any:
    """The model compiled (cffi API mode) into a temporary directory; its ``lib``."""
    import cffi  # type: ignore[import-untyped]  # (a build dependency: no stubs)

    ffi = cffi.FFI()
    ffi.cdef(_CDEF)
    ffi.set_source("_emq_thread_ceiling", _SOURCE, extra_compile_args=["-O2"])
    where = tempfile.mkdtemp(prefix="emq-thread-ceiling-")
    path = ffi.compile(tmpdir=where)
    spec = importlib.util.spec_from_file_location("_emq_thread_ceiling", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lib


def one_round(lib: Any, n: int, threads: int) -> Tuple[float, float, float]:
    """(reference jobs/s, threads jobs/s, jobs per flush) of one round."""
    began = time.perf_counter()
    for _ in range(n // 500):
        lib.gc_many(500)
    many = n / (time.perf_counter() - began)
    per = n // threads
    start = threading.Barrier(threads + 1)

    def producer() -> None:
        start.wait()
        for i in range(per):
            lib.gc_submit(i)
    pool = [threading.Thread(target=producer) for _ in range(threads)]
    for t in pool:
        t.start()
    flushes = lib.gc_flushes()
    start.wait()
    began = time.perf_counter()
    for t in pool:
        t.join()
    rate = per * threads / (time.perf_counter() - began)
    return many, rate, per * threads / max(lib.gc_flushes() - flushes, 1)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Print the model's ratio (threads / one call per 500 jobs) for both hand-over rules."""
    p = argparse.ArgumentParser(prog="python -m bench.thread_ceiling",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--n", type=int, default=16_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--call-us", type=float, default=30.0, help="server time per call")
    p.add_argument("--job-us", type=float, default=3.5, help="server time per job")
    args = p.parse_args(argv)
    lib = build()
    for keep, rule in ((0, "hand-on"), (1, "keep-leading")):
        lib.gc_config(int(args.call_us * 1000), int(args.job_us * 1000), keep)
        rows: List[Tuple[float, float, float]] = [one_round(lib, args.n, args.threads)
                                                  for _ in range(args.reps)]
        ratios = [rate / many for many, rate, _ in rows]
        print(f"{rule}: {args.threads} threads {statistics.median(r[1] for r in rows):,.0f} "
              f"jobs/s vs one call per 500 {statistics.median(r[0] for r in rows):,.0f} "
              f"-> {statistics.median(ratios):.3f}x (per round "
              f"{[round(r, 3) for r in ratios]}; jobs per flush "
              f"{statistics.median(r[2] for r in rows):.1f})")


if __name__ == "__main__":
    main()
