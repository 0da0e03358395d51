"""``emqfast bench --peers``: what it reports and where it writes it.

The figures themselves are benchmarks (BENCHMARKS.md); these tests hold the
arithmetic behind them (medians and spread of the rounds, ratios, duplicates and
losses counted), the pins they disclose, the Markdown they render, the rewrite
of BENCHMARKS.md's peers section (nothing outside its markers touched), and one
peer's driver run end to end against a real Redis from its own pinned venv."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import peer_driver, peers  # noqa: E402
from bench.common import VerificationError  # noqa: E402

MACHINE = {"cpus": "2", "redis_server": "7.0.15", "backend": "c"}


def _rounds(rates, **drain):
    return [{"jobs_per_s": r, "version": "9.9.9", **drain} for r in rates]


def _samples(dup=0, lost=0):
    """Three rounds of emqfast and two peers, as the drivers answer."""
    ok = {"runs": 100, "duplicates": 0, "lost": 0}
    return {
        ("emqfast", "enqueue"): _rounds([90_000, 100_000, 120_000]),
        ("bullmq", "enqueue"): _rounds([10_000, 20_000, 30_000]),
        ("saq", "enqueue"): _rounds([4_000, 5_000, 8_000]),
        ("emqfast", "drain"): _rounds([20_000, 18_000, 22_000], **ok),
        ("bullmq", "drain"): _rounds([1_000, 1_200, 900], **ok),
        ("saq", "drain"): (_rounds([1_100, 1_000], **ok)
                           + _rounds([1_050], runs=100 + dup, duplicates=dup, lost=lost)),
    }


def test_every_peer_is_pinned_to_an_exact_version():
    versions = {peer: peers.pinned_version(req) for peer, req in peers.PINS.items()}
    assert set(versions) == {"bullmq", "rq", "arq", "saq"}
    assert all(v and v[0].isdigit() and v.count(".") >= 1 for v in versions.values())
    assert peers.pinned_version("saq[redis]==0.26.4") == "0.26.4"
    for loose in ("rq", "rq>=3", "rq==3.*", "rq~=3.0", "rq==3.0,<4"):
        with pytest.raises(ValueError):
            peers.pinned_version(loose)


def test_every_contender_discloses_its_settings_as_the_driver_runs_them():
    assert set(peers.SETTINGS) == {"emqfast", *peers.PINS}
    for who, settings in peers.SETTINGS.items():
        assert set(settings) == set(peers.WORKLOADS), who
    # the numbers disclosed are the ones the driver uses
    assert f"concurrency {peer_driver.CONCURRENCY}" in peers.SETTINGS["bullmq"]["drain"]
    assert f"max_jobs {peer_driver.CONCURRENCY}" in peers.SETTINGS["arq"]["drain"]
    assert f"concurrency {peer_driver.CONCURRENCY}" in peers.SETTINGS["saq"]["drain"]
    assert peers.CLOSE_TIMEOUT_S == peer_driver.CLOSE_TIMEOUT_S
    for peer in ("arq", "saq"):
        assert f"{peer_driver.IN_FLIGHT} awaited together" in peers.SETTINGS[peer]["enqueue"]


def test_spread_is_median_min_and_max_of_the_rounds():
    assert peers.spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert peers.spread([1.0, 2.0, 3.0, 10.0]) == (2.5, 1.0, 10.0)
    assert peers.spread([7.0]) == (7.0, 7.0, 7.0)
    with pytest.raises(VerificationError):
        peers.spread([])


def test_rotation_puts_each_contender_first_once_in_as_many_rounds():
    who = ["emqfast", "bullmq", "rq", "arq", "saq"]
    orders = [peers.rotated(who, k) for k in range(len(who))]
    assert [o[0] for o in orders] == who
    assert all(sorted(o) == sorted(who) for o in orders)
    assert peers.rotated(who, len(who)) == who


def test_rows_are_medians_with_ratios_against_emqfasts_median():
    rows = {(r.details["contender"], r.details["workload"]): r
            for r in peers.summarize(_samples(), {"enqueue": 20_000, "drain": 100})}
    bull = rows[("bullmq", "enqueue")]
    assert bull.value == 20_000 and (bull.details["min"], bull.details["max"]) == (10_000, 30_000)
    assert bull.reference == 100_000 and bull.ratio == pytest.approx(5.0)
    assert rows[("saq", "drain")].ratio == pytest.approx(20_000 / 1_050)
    assert rows[("emqfast", "drain")].ratio is None
    assert rows[("bullmq", "drain")].verified == "100/100 exactly once, each of 3 rounds"


def test_a_peer_that_runs_a_job_twice_is_reported_not_hidden():
    rows = {(r.details["contender"], r.details["workload"]): r
            for r in peers.summarize(_samples(dup=1, lost=2), {"enqueue": 20_000, "drain": 100})}
    saq = rows[("saq", "drain")]
    assert (saq.details["duplicates"], saq.details["lost"]) == (1, 2)
    assert "1 ran twice, 2 never ran" in saq.verified
    md = peers.to_markdown(list(rows.values()), MACHINE, "emqfast bench --peers")
    saq_line = next(ln for ln in md.splitlines() if ln.startswith("| SAQ 9.9.9 "))
    assert "did not finish closing" not in md
    assert saq_line.rstrip(" |").endswith("1 / 2")


def test_markdown_discloses_figures_spread_pins_settings_and_machine():
    results = peers.summarize(_samples(), {"enqueue": 20_000, "drain": 100})
    md = peers.to_markdown(results, MACHINE, "emqfast bench --only peers --rounds 3",
                           revision="abc1234", when="2026-12-06 01:00 UTC")
    lines = md.splitlines()
    assert "`emqfast bench --only peers --rounds 3` at commit abc1234, 2026-12-06" in lines[0]
    assert "3 rounds" in lines[0]
    bull = next(ln for ln in lines if ln.startswith("| BullMQ-py 9.9.9 |"))
    cells = [c.strip() for c in bull.strip("|").split("|")]
    assert cells[1:] == ["20,000 jobs/s (10,000–30,000)", "5.0×", "1,000 jobs/s (900–1,200)",
                         "20.0×", "0 / 0"]
    assert any(ln.startswith("| emqfast 9.9.9 (c backend) | 100,000 jobs/s") for ln in lines)
    assert f"`{peers.PINS['saq']}`" in md and f"`{peers.PINS['bullmq']}`" in md
    assert peers.SETTINGS["saq"]["enqueue"] in md
    assert "BullMQ-py drain 1,000 / 1,200 / 900" in md  # every round's figure, in order
    assert "redis_server 7.0.15" in md


SECTION_V1 = "| a | b |\n|---|---|\n| 1 | 2 |\n"
SECTION_V2 = "| a | b |\n|---|---|\n| 3 | 4 |\n"


def test_section_rewrite_keeps_markers_and_everything_outside_them():
    before = "# Benchmarks\n\nintro\n\n" + peers.BEGIN + "\nold table\n" + peers.END + "\n\nafter\n"
    once = peers.replace_section(before, SECTION_V1)
    assert once.startswith("# Benchmarks\n\nintro\n\n" + peers.BEGIN + "\n")
    assert once.endswith(peers.END + "\n\nafter\n")
    assert SECTION_V1 in once and "old table" not in once
    twice = peers.replace_section(once, SECTION_V2)
    assert twice == once.replace(SECTION_V1, SECTION_V2)
    assert peers.replace_section(twice, SECTION_V1) == once  # round trip


def test_section_rewrite_adds_markers_when_missing_and_refuses_broken_ones():
    text = "# Benchmarks\n\nsomething\n"
    added = peers.replace_section(text, SECTION_V1)
    assert added.startswith(text) and added.count(peers.BEGIN) == added.count(peers.END) == 1
    assert peers.replace_section(added, SECTION_V2) == added.replace(SECTION_V1, SECTION_V2)
    with pytest.raises(VerificationError):
        peers.replace_section(f"{peers.END}\nx\n{peers.BEGIN}\n", SECTION_V1)
    with pytest.raises(VerificationError):
        peers.replace_section(f"{peers.BEGIN}\nx\n", SECTION_V1)


def test_update_benchmarks_touches_only_the_peers_section_of_the_real_file(tmp_path):
    original = (ROOT / "BENCHMARKS.md").read_text()
    assert original.count(peers.BEGIN) == original.count(peers.END) == 1
    copy = tmp_path / "BENCHMARKS.md"
    copy.write_text(original)
    peers.update_benchmarks(copy, SECTION_V1)
    got = copy.read_text()
    head, tail = original.split(peers.BEGIN)[0], original.split(peers.END)[1]
    assert got.startswith(head + peers.BEGIN + "\n" + SECTION_V1)
    assert got.endswith(peers.END + tail)


@pytest.mark.peers_venv
def test_rq_driver_runs_from_its_own_pinned_venv_and_leaves_nothing(redis_url):
    """One peer end to end (RQ: the quickest venv to build, cached across runs)."""
    if os.environ.get("EMQ_SKIP_PEER_VENVS"):
        pytest.skip("EMQ_SKIP_PEER_VENVS set: no PyPI to build the peer's venv from")
    try:
        python = peers.ensure_venv(peers.venv_root(), "rq")
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"could not build RQ's venv (PyPI unreachable?): {exc}")
    client = redis.Redis.from_url(redis_url)
    before = set(client.scan_iter(match="rq:*", count=1000))
    try:
        enq = peers.drive(python, "rq", "enqueue", redis_url, 200)
        drain = peers.drive(python, "rq", "drain", redis_url, 200)
    finally:
        left = set(client.scan_iter(match="rq:*", count=1000)) - before
        client.close()
    assert enq["version"] == peers.pinned_version(peers.PINS["rq"])
    assert enq["jobs_per_s"] > 0 and enq["verified"] == "200/200 queued"
    assert (drain["runs"], drain["distinct"], drain["duplicates"], drain["lost"]) == (200, 200, 0, 0)
    assert left == set()


def test_a_peer_worker_that_never_finishes_closing_is_disclosed():
    samples = _samples()
    samples[("bullmq", "drain")][1]["close_timed_out"] = True
    results = peers.summarize(samples, {"enqueue": 20_000, "drain": 100})
    md = peers.to_markdown(results, MACHINE, "emqfast bench --peers")
    assert (f"BullMQ-py's worker did not finish closing within {peers.CLOSE_TIMEOUT_S} s "
            "after 1 of 3 drains") in md
