"""emqfast's benchmark suite (ships as ``emqfast.bench``).

Run it with ``emqfast bench`` or ``python bench/run.py``; see ``bench/run.py``
for the options and BENCHMARKS.md for the latest figures. Each workload lives
in its own module and exposes ``run(ctx) -> list[Result]``.
"""
