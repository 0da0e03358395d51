"""Micro-benchmarks of the batch arithmetic, C core vs pure Python, 10k items each.

    python -m pytest bench/bench_micro.py --benchmark-group-by=group

Needs pytest-benchmark (the `test` extra). The C rows are skipped when the
extension is not built.
"""
from __future__ import annotations

import importlib
import random

import pytest

from emqfast.backends import pure as _pure

backend = importlib.import_module("emqfast.backend")  # emqfast.backend is also a function

N = 10_000
_rng = random.Random(1234)
RUN_ATS = [_pure.EPOCH_MS + _rng.randrange(0, 10**10) for _ in range(N)]
SEQS = list(range(N))
ATTEMPTS = [_rng.randrange(1, 20) for _ in range(N)]
SEEDS = [_rng.getrandbits(64) for _ in range(N)]


@pytest.fixture(params=["c", "python"])
def impl(request):
    """The module under test: ``_native`` or ``_pure``."""
    if request.param == "python":
        return _pure
    if not backend.native_available():
        pytest.skip("C core not built: " + backend.native_error())
    return importlib.import_module("emqfast.backends.native")


def test_pack_delayed_many(benchmark, impl):
    benchmark.group = "pack_delayed_many 10k"
    out = benchmark(impl.pack_delayed_many, RUN_ATS, SEQS)
    assert out == _pure.pack_delayed_many(RUN_ATS, SEQS)


def test_backoff_delay_many_exponential_band(benchmark, impl):
    benchmark.group = "backoff_delay_many 10k (exponential, band 0.2)"
    args = (_pure.KIND_EXPONENTIAL, 1000, 3_600_000, 0.2, False, ATTEMPTS, SEEDS)
    out = benchmark(impl.backoff_delay_many, *args)
    assert out == _pure.backoff_delay_many(*args)


def test_backoff_delay_many_full_jitter(benchmark, impl):
    benchmark.group = "backoff_delay_many 10k (exponential, full jitter)"
    args = (_pure.KIND_EXPONENTIAL, 1000, 3_600_000, 0.0, True, ATTEMPTS, SEEDS)
    out = benchmark(impl.backoff_delay_many, *args)
    assert out == _pure.backoff_delay_many(*args)
