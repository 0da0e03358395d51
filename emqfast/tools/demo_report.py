"""The demo's terminal report: what ran and when, one section per part, the check-list.

Every time is a server-clock instant (a job timestamp or ``TIME`` read by the
handler), shown as time of day plus the offset from the demo's start.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, List, Optional
from zoneinfo import ZoneInfo

from rich.console import Group
from rich.table import Table
from rich.text import Text

from emqfast.tools import demo_plan as d
from emqfast.tools.render import fmt_delta, fmt_ms


def sections(sc: d.Scenario) -> List[Any]:
    """The report's parts, in reading order."""
    return [timeline_table(sc), reminder_section(sc), schedule_section(sc),
            priority_section(sc), retry_section(sc), ranking_section(sc),
            certificate_section(sc), nudge_section(sc)]


def _t(sc: d.Scenario, ms: Optional[int]) -> str:
    """Server time of day plus offset from the start of the demo."""
    if ms is None:
        return "-"
    return f"{fmt_ms(ms, date=False)}  {_plus(sc, ms)}"


def _plus(sc: d.Scenario, ms: int) -> str:
    return f"+{(ms - sc.t0_ms) / 1000:.3f} s"


def _label(run: d.Run) -> str:
    return {"reminder": "lesson reminder", "bulk": "bulk mail",
            "reset": "password-reset email", "send": "digest e-mail (flaky)",
            "digest": "weekly digest", "grade": "lesson grading",
            "certificate": "course certificate", "nudge": "come-back nudge"}.get(run.kind, run.kind)


def timeline_table(sc: d.Scenario) -> Table:
    """What ran, in order, when (server clock); consecutive bulk mails are folded."""
    table = Table(title="What ran, in order — one worker, concurrency 1; server clock (UTC) and "
                        "time since the start", title_justify="left")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("since start", justify="right", no_wrap=True)
    table.add_column("job")
    table.add_column("try", justify="right")
    table.add_column("outcome")
    table.add_column("detail")
    runs = list(sc.timeline.runs)
    i = 0
    while i < len(runs):
        run = runs[i]
        if run.kind == "bulk":
            j = i
            while j + 1 < len(runs) and runs[j + 1].kind == "bulk":
                j += 1
            if j > i:
                ok = all(r.outcome == "completed" for r in runs[i:j + 1])
                table.add_row(f"{run.seq}–{runs[j].seq}", fmt_ms(run.started_ms, date=False),
                              _plus(sc, run.started_ms),
                              f"bulk mail ×{j - i + 1}", "1",
                              Text("completed" if ok else "mixed", "green" if ok else "yellow"),
                              f"priority {d.BULK_PRIORITY}")
                i = j + 1
                continue
        style = {"completed": "green", "failed": "red"}.get(run.outcome, "yellow")
        detail = run.detail.split(": ", 1)[-1] if run.outcome == "failed" else run.detail
        table.add_row(str(run.seq), fmt_ms(run.started_ms, date=False),
                      _plus(sc, run.started_ms), _label(run), str(run.attempt),
                      Text(run.outcome, style), detail)
        i += 1
    return table


def _heading(text: str, note: str = "") -> Text:
    out = Text(text, style="bold")
    if note:
        out.append("  " + note, style="dim")
    return out


def reminder_section(sc: d.Scenario) -> Group:
    """Part 1: enqueued, due and ran, on the server clock."""
    job = sc.jobs.get(sc.reminder_id)
    runs = sc.timeline.of("reminder")
    table = Table(show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("enqueued", _t(sc, job.created_ms if job else None))
    table.add_row("due (run at)", _t(sc, job.run_at_ms if job else None))
    table.add_row("ran", _t(sc, runs[0].started_ms if runs else None))
    if job and runs and job.created_ms:
        table.add_row("waited", f"{runs[0].started_ms - job.created_ms} ms "
                                f"(asked for {d.DAY_MS} ms)")
    return Group(_heading("1 · Lesson reminder — a one-shot delayed job",
                          f"enqueue_in(payload, {d.DAY_MS}): 'tomorrow' compressed to "
                          f"{fmt_delta(d.DAY_MS)}"), table)


def schedule_section(sc: d.Scenario) -> Any:
    """Part 2: registry size across boots, and the schedules with next runs in Paris time."""
    sf = sc.schedules
    if not sf.available:
        return Text(f"2 · Weekly digest — {sf.error}", style="red")
    boots = Table()
    boots.add_column("boot", justify="right")
    boots.add_column("registry entries", justify="right")
    boots.add_column("'weekly-digest' entries", justify="right")
    for i, (n, weekly) in enumerate(sf.after_boot, start=1):
        boots.add_row(str(i), str(n), str(weekly))
    listed = Table()
    for name in ("name", "cadence", "time zone", "next run (schedule's zone)"):
        listed.add_column(name)
    for s in sf.listed:
        tz = s.get("tz") or "UTC"
        cadence = f"cron {s['cron']}" if s.get("cron") else f"every {fmt_delta(s.get('every_ms'))}"
        nxt = s.get("next_ms")
        listed.add_row(s["name"], cadence, tz,
                       fmt_ms(nxt, ZoneInfo(tz)) + (f" ({_weekday(nxt, tz)})" if nxt else ""))
    note = Text("The weekly cron cannot fire during a demo, so the same digest also runs every "
                f"{fmt_delta(d.DIGEST_EVERY_MS)} (compressed time); that cadence is removed "
                "at the end.", style="dim")
    return Group(_heading("2 · Weekly digest — a cron schedule upserted at every boot",
                          f"schedules.upsert('weekly-digest', cron={d.WEEKLY_CRON!r}, "
                          f"tz={d.DIGEST_TZ!r}) on each of {d.BOOTS} boots"),
                 boots, Text("the registry afterwards (next runs in each schedule's zone):"),
                 listed, note)


def _weekday(ms: int, tz: str) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, ZoneInfo(tz)).strftime("%A")


def priority_section(sc: d.Scenario) -> Text:
    """Part 3: enqueue order vs run order."""
    order = [r for r in sc.timeline.runs if r.kind in ("reset", "bulk")]
    pos = next((i for i, r in enumerate(order, start=1) if r.kind == "reset"), None)
    bulk_first = next((r for r in order if r.kind == "bulk"), None)
    text = _heading("3 · Password reset — a priority job overtakes the backlog\n")
    text.append(f"   enqueued last, after {d.BULK_MAILS} bulk mails "
                f"(priority {d.BULK_PRIORITY}), with priority {d.RESET_PRIORITY} "
                "(lower runs first)\n")
    reset = next((r for r in order if r.kind == "reset"), None)
    text.append(f"   ran #{pos if pos else '?'} of {len(order)} at "
                f"{_t(sc, reset.started_ms if reset else None)}; first bulk mail at "
                f"{_t(sc, bulk_first.started_ms if bulk_first else None)}")
    return text


def retry_section(sc: d.Scenario) -> Group:
    """Part 4: every attempt of the flaky send with its backoff delay."""
    b = d.SEND_BACKOFF
    table = Table()
    for name in ("attempt", "started", "outcome", "retry delay after it", "backoff band"):
        table.add_column(name)
    for run, delay, _due in d.retry_delays(sc):
        lo, hi = d.band(run.attempt)
        style = "green" if run.outcome == "completed" else "red"
        table.add_row(str(run.attempt), _t(sc, run.started_ms),
                      Text(run.outcome + ("" if run.outcome == "completed" else
                                          f" ({run.detail.split(': ', 1)[-1]})"), style),
                      fmt_delta(delay) if delay is not None else "-",
                      f"{lo}–{hi} ms" if run.outcome != "completed" else "-")
    return Group(_heading("4 · Failed send — retried with exponential backoff + jitter",
                          f"base {b.base_ms} ms, ×2 per attempt, ±{b.band:.0%}; the provider "
                          f"refuses the first {d.SEND_FAILURES} tries"), table)


def ranking_section(sc: d.Scenario) -> Group:
    """Part 5: the board and what the digest carried."""
    table = Table()
    table.add_column("rank", justify="right")
    table.add_column("learner")
    table.add_column("progress", justify="right")
    for e in sc.board.top(len(d.LEARNERS)):
        table.add_row(str(e.rank), e.member, f"{e.score:g} %",
                      style="bold" if e.rank <= d.TOP_N else "")
    digests = [r for r in sc.timeline.of("digest") if r.outcome == "completed"]
    carried = Text(f"   {d.LESSON_DONE[0]} finished a lesson: +{d.LESSON_DONE[1]} % (incr). ")
    if digests:
        top = ", ".join(f"{m} ({s:g} %)" for m, s in digests[0].result["top"])
        carried.append(f"The digest at {_t(sc, digests[0].started_ms)} carried the top "
                       f"{d.TOP_N}: {top}")
    else:
        carried.append("No digest ran.", style="red")
    return Group(_heading("5 · Ranking — the leaderboard the digest carries",
                          f"Leaderboard {d.BOARD!r}: progress %, ties ranked by name"),
                 table, carried)


def certificate_section(sc: d.Scenario) -> Group:
    """Part 6: the gradings, the certificate that waited for them, and the wait."""
    table = Table()
    for name in ("job", "state at enqueue", "ran", "result"):
        table.add_column(name)
    for run in sc.timeline.of("grade") + sc.timeline.of("certificate"):
        first = run.kind == "certificate"
        table.add_row(_label(run), (sc.cert_ref.status if sc.cert_ref else "?") if first
                      else "scheduled", _t(sc, run.started_ms), run.detail)
    w = sc.cert_waited
    woke = Text(f"   ref.wait() woke at {_t(sc, w.woke_ms)}: ")
    if isinstance(w.result, dict) and "average" in w.result:
        woke.append(f"the certificate for {w.result['to']}, average {w.result['average']:g} "
                    f"over {len(w.result['grades'])} lessons")
    else:
        woke.append(w.error or "nothing", style="red")
    return Group(_heading(f"6 · Certificate — waits for every lesson's grading, then "
                          "ref.wait() wakes",
                          f"enqueue(..., depends_on=[{len(d.LESSONS)} grading refs]) for "
                          f"{d.CERT_LEARNER}; the page blocks on ref.wait(), no polling"),
                 table, woke)


def nudge_section(sc: d.Scenario) -> Group:
    """Part 7: each activity and what it did to the one waiting nudge."""
    table = Table()
    for name in ("activity", "at", "ref status", "job"):
        table.add_column(name)
    for i, ping in enumerate(sc.pings, start=1):
        table.add_row(str(i), _t(sc, ping.at_ms), ping.status, ping.job_id)
    runs = sc.timeline.of("nudge")
    sent = Text(f"   sent {len(runs)}× at {_t(sc, runs[0].started_ms if runs else None)}")
    if runs and sc.pings:
        sent.append(f", {runs[0].started_ms - sc.pings[-1].at_ms} ms after the last activity")
    return Group(_heading("7 · Nudge — debounced while the learner is active",
                          f"enqueue_in(..., {d.NUDGE_QUIET_MS}, dedupe_key='nudge:"
                          f"{d.NUDGE_LEARNER}', dedupe='replace') at every activity"),
                 table, sent)


def checklist(results: List[d.Check]) -> Table:
    """✓/✗ per expectation."""
    table = Table(title="Expectations", title_justify="left", show_header=False)
    table.add_column(width=2)
    table.add_column()
    table.add_column(style="dim")
    for c in results:
        mark = Text("✓", "bold green") if c.ok else Text("✗", "bold red")
        table.add_row(mark, c.label, c.detail)
    return table
