"""Terminal rendering shared by the CLI and the demo: times and job tables (rich).

Every time shown is a server-clock epoch-ms value (a job timestamp or
``Queue.server_time_ms()``), never the local machine's clock.

Stored strings (queue names, job ids, payloads, errors) are written by whoever can
enqueue: they reach the terminal only through :func:`plain` / :func:`visible`, as text
(never rich markup) with every control character shown as an escape (``\\x1b``), so
nothing they hold can steer the terminal, forge a line or become a link.
"""
from __future__ import annotations

import datetime as dt
import json
from typing import Any, Dict, Iterable, List, Match, Optional, Tuple, Union

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from emqfast.core.printable import UNSEEN, printable
from emqfast.facade.job import Job


def visible(text: str, lines: bool = False) -> str:
    """``text`` with every control or invisible formatting character written as an
    escape (``\\x1b``, ``\\x9b``, ``\\u202e``), so a terminal shows it instead of obeying
    it (:func:`emqfast.core.printable.printable`). ``lines``: keep newlines and tabs (a
    traceback, ``--full``); ``\\r`` is always escaped (it would overwrite the line)."""
    return printable(text, lines)


def _json_escape(match: Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def json_text(data: Any) -> str:
    """``data`` as JSON for ``--json``: exact (it parses back to the same values), UTF-8
    text kept as is, but every control or invisible formatting character written as a
    ``\\uXXXX`` escape (json.dumps leaves C1, DEL and bidi overrides raw)."""
    return UNSEEN.sub(_json_escape, json.dumps(data, ensure_ascii=False))


def plain(value: Any, style: str = "", lines: bool = False) -> Text:
    """``value`` as rich text that is never parsed as markup, controls made
    :func:`visible`."""
    return Text(visible(str(value), lines), style=style)


def styled(*parts: Union[str, Tuple[str, str]]) -> Text:
    """One line of CLI output from parts: a plain ``str``, or ``(text, style)`` such as
    ``("cancelled", "green")``; every part is :func:`visible` text, never markup."""
    out = Text()
    for part in parts:
        text, style = (part, "") if isinstance(part, str) else part
        out.append(visible(text), style=style)
    return out


STATE_STYLES = {"scheduled": "cyan", "pending": "yellow", "grouped": "yellow",
                "active": "blue", "completed": "green", "failed": "red"}


def fmt_ms(epoch_ms: Optional[int], tz: Optional[dt.tzinfo] = None, *, date: bool = True) -> str:
    """An epoch-ms instant as text (UTC unless ``tz``; ``date=False``: time of day only,
    for tables whose title carries the date); ``-`` for None."""
    if epoch_ms is None:
        return "-"
    when = dt.datetime.fromtimestamp(epoch_ms / 1000, tz or dt.timezone.utc)
    text = when.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S")
    text += f".{epoch_ms % 1000:03d}"
    return text + (" " + (when.tzname() or "") if date else "")


def fmt_delta(ms: Optional[float]) -> str:
    """A duration in ms, human-sized (``850 ms``, ``3.2 s``, ``4 min``, ``2.5 h``, ``6 d``)."""
    if ms is None:
        return "-"
    a = abs(ms)
    if a < 1000:
        text = f"{a:.0f} ms"
    elif a < 60_000:
        text = f"{a / 1000:.1f} s"
    elif a < 3_600_000:
        text = f"{a / 60_000:.0f} min"
    elif a < 86_400_000:
        text = f"{a / 3_600_000:.1f} h"
    else:
        text = f"{a / 86_400_000:.1f} d"
    return ("-" if ms < 0 else "") + text


def fmt_relative(epoch_ms: Optional[int], now_ms: int) -> str:
    """``in 3.2 s`` / ``3.2 s ago`` relative to the server's ``now_ms``."""
    if epoch_ms is None:
        return "-"
    delta = epoch_ms - now_ms
    return f"in {fmt_delta(delta)}" if delta >= 0 else f"{fmt_delta(-delta)} ago"


def state_text(state: str) -> Text:
    """A job state, coloured."""
    return plain(state, STATE_STYLES.get(state, ""))


def short_error(error: Optional[str], width: int = 60) -> str:
    """First line of an error, cut to ``width``."""
    if not error:
        return ""
    line = error.strip().splitlines()[0] if error.strip() else ""
    return line if len(line) <= width else line[:width - 1] + "…"


# the older columns keep their places (scripts read them); states come after
_COLUMNS = ("scheduled", "pending", "grouped", "active", "completed", "failed", "cancelled",
            "expired", "waiting_deps")
# a narrow terminal's first table (80 columns fit); the rest go in the second one
_NARROW_COUNTS = ("scheduled", "pending", "grouped", "active", "completed", "failed",
                  "cancelled")
_NARROW_REST = tuple(s for s in _COLUMNS if s not in _NARROW_COUNTS)
WIDE_TABLE_COLUMNS = 180  # below this, stats prints two narrow tables (80 columns fit)


def _next_due_text(row: Dict[str, Any], now_ms: int) -> str:
    nxt = row.get("next_due_ms")
    return f"{fmt_ms(nxt, date=False)} ({fmt_relative(nxt, now_ms)})" if nxt else "-"


def counts_table(rows: Iterable[Dict[str, Any]], now_ms: int, title: str = "Queues",
                 width: Optional[int] = None) -> Any:
    """One row per queue: counts per state (pending includes the grouped jobs waiting in
    lanes, also shown on their own), paused flag, next due job, schedules.

    ``width`` (the console's) below :data:`WIDE_TABLE_COLUMNS`: the counts and the rest
    as two borderless tables whose headers fit 80 columns whole (one wide table cut them
    to ``sche…``); a long queue name folds instead."""
    rows = list(rows)
    if width is not None and width < WIDE_TABLE_COLUMNS:
        return _narrow_tables(rows, now_ms, title)
    table = Table(title=plain(title), title_justify="left")
    table.add_column("queue", style="bold", overflow="fold")
    for state in _COLUMNS:
        table.add_column(state, justify="right", style=STATE_STYLES.get(state, "dim"))
    table.add_column("paused")
    table.add_column("next due", no_wrap=True)
    table.add_column("schedules", justify="right")
    for row in rows:
        c = row["counts"]
        table.add_row(plain(row["queue"]), *(str(c.get(s, 0)) for s in _COLUMNS),
                      "yes" if row.get("paused") else "no", _next_due_text(row, now_ms),
                      str(row.get("schedules", "-")))
    return table


def _narrow_table(title: Optional[str]) -> Table:
    table = Table(title=None if title is None else plain(title), title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False, show_edge=False)
    table.add_column("queue", style="bold", overflow="fold", min_width=5)
    return table


def _narrow_tables(rows: List[Dict[str, Any]], now_ms: int, title: str) -> Group:
    """:func:`counts_table` for a narrow terminal: counts, then paused/next due/schedules."""
    counts = _narrow_table(title)
    for state in _NARROW_COUNTS:
        counts.add_column(state, justify="right", style=STATE_STYLES.get(state, "dim"),
                          no_wrap=True)
    timing = _narrow_table(None)
    for state in _NARROW_REST:
        timing.add_column(state, justify="right", style=STATE_STYLES.get(state, "dim"),
                          no_wrap=True)
    for name in ("paused", "next due", "schedules"):
        timing.add_column(name, no_wrap=True, justify="right" if name == "schedules" else "left")
    for row in rows:
        c = row["counts"]
        counts.add_row(plain(row["queue"]), *(str(c.get(s, 0)) for s in _NARROW_COUNTS))
        timing.add_row(plain(row["queue"]), *(str(c.get(s, 0)) for s in _NARROW_REST),
                       "yes" if row.get("paused") else "no",
                       _next_due_text(row, now_ms), str(row.get("schedules", "-")))
    return Group(counts, timing)


def stats_line(row: Dict[str, Any], now_ms: int) -> str:
    """One queue's numbers as one plain ``key=value`` line, for ``stats --watch`` into a
    file or a pipe (greppable; one line per queue per refresh)."""
    c = row["counts"]
    nxt = row.get("next_due_ms")
    due = f"{fmt_ms(nxt)} ({fmt_relative(nxt, now_ms)})" if nxt else "-"
    return " ".join([fmt_ms(now_ms), f"queue={visible(row['queue'])}",
                     *(f"{s}={c.get(s, 0)}" for s in _COLUMNS),
                     f"paused={'yes' if row.get('paused') else 'no'}",
                     f"schedules={row.get('schedules', '-')}", f"next_due={due}"])


def jobs_table(jobs: Iterable[Job], now_ms: int, title: str) -> Table:
    """Jobs as rows: id, state, attempts, priority, times, last error."""
    table = Table(title=plain(title), title_justify="left")
    for name in ("id", "state", "attempts", "prio", "created", "run at", "finished", "error"):
        table.add_column(name, no_wrap=name != "error")
    for job in jobs:
        table.add_row(plain(job.id), state_text(job.state), f"{job.attempts}/{job.max_attempts}",
                      str(job.priority), fmt_ms(job.created_ms, date=False),
                      fmt_ms(job.run_at_ms, date=False), fmt_ms(job.finished_ms, date=False),
                      plain(short_error(job.error)))
    return table


def _json_able(value: Any) -> Any:
    """bytes (a payload or a result) as ``{"bytes": text with escapes}``, else as is."""
    if isinstance(value, bytes):
        return {"bytes": value.decode("utf-8", "backslashreplace")}
    return value


def job_dict(job: Job) -> Dict[str, Any]:
    """A job as plain JSON-able data (bytes payloads and results shown as text with escapes)."""
    payload = _json_able(job.payload)
    return {"id": job.id, "queue": job.queue, "state": job.state, "payload": payload,
            "attempts": job.attempts, "max_attempts": job.max_attempts,
            "priority": job.priority, "backoff": repr(job.backoff) if job.backoff else None,
            "created_ms": job.created_ms, "run_at_ms": job.run_at_ms,
            "started_ms": job.started_ms, "finished_ms": job.finished_ms,
            "result": _json_able(job.result), "error": job.error, "traceback": job.traceback,
            "stalls": job.stalls}


PREVIEW_CHARS = 2000  # the most of a payload/result/traceback ``jobs QUEUE JOB`` shows
LONG_FIELDS = ("payload", "result", "error", "traceback")


def fmt_size(n: int) -> str:
    """A byte count for people: ``850 B``, ``12.3 KB``, ``20.0 MB`` (1 KB = 1024 B)."""
    if n < 1024:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KB"
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MB"
    return f"{n / (1 << 30):.1f} GB"


def preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out and how to see
    it (a 20 MB payload rendered whole took minutes of CPU in rich)."""
    if len(text) <= limit:
        return text
    return (f"{text[:limit]}… [{len(text) - limit:,} more characters; "
            f"--full prints everything]")


def field_text(value: Any) -> str:
    """One field of :func:`job_dict` as the text the detail table shows (uncut)."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return "-" if value is None else str(value)


def job_detail_table(job: Job, now_ms: int, payload_bytes: Optional[int] = None) -> Table:
    """Every field of one job, one per row; long ones (payload, result, error, traceback)
    as a preview of :data:`PREVIEW_CHARS` characters. ``payload_bytes``: the stored
    payload's size, shown on its own row."""
    table = Table(title=plain(f"job {job.id}"), title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    data = job_dict(job)
    for name, value in data.items():
        if name.endswith("_ms"):
            value = f"{fmt_ms(value)} ({fmt_relative(value, now_ms)})" if value else "-"
        elif name == "state":
            value = state_text(value)
        else:
            value = field_text(value)
            if name in LONG_FIELDS:
                value = preview(value)
        table.add_row(name.replace("_ms", ""),
                      value if isinstance(value, Text) else plain(value, lines=True))
        if name == "payload" and payload_bytes is not None:
            table.add_row("payload size", f"{fmt_size(payload_bytes)} ({payload_bytes:,} bytes)")
    return table
