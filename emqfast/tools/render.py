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
from rich.console import Console, Group
from rich.measure import Measurement
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


def fmt_span(ms: float) -> str:
    """A duration rounded for a relative time: ``850 ms``, ``42 s``, ``3 min``, ``26 h``,
    ``12 d``, ``3.4 y`` (minutes up to 90, hours up to 48, days up to a year)."""
    a = abs(ms)
    if a < 1000:
        return f"{a:.0f} ms"
    if a < 60_000:
        return f"{a // 1000:.0f} s"
    if a < 5_400_000:
        return f"{round(a / 60_000)} min"
    if a < 172_800_000:
        return f"{round(a / 3_600_000)} h"
    if a < 31_557_600_000:
        return f"{round(a / 86_400_000)} d"
    return f"{a / 31_557_600_000:.1f} y"


def fmt_relative(epoch_ms: Optional[int], now_ms: int) -> str:
    """``in 2 h`` / ``3 min ago`` relative to the server's ``now_ms``."""
    if epoch_ms is None:
        return "-"
    delta = epoch_ms - now_ms
    return f"in {fmt_span(delta)}" if delta >= 0 else f"{fmt_span(-delta)} ago"


def _utc(epoch_ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.timezone.utc)


def fmt_when(epoch_ms: Optional[int], now_ms: int) -> str:
    """An instant in a table row (UTC, like the title's server clock): the time of day
    when it falls on the server's today, the date and time on any other day
    (``2030-05-01 18:25:14``: a job due tomorrow never reads as due today)."""
    if epoch_ms is None:
        return "-"
    when = _utc(epoch_ms)
    today = when.date() == _utc(now_ms).date()
    return when.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M:%S")


def fmt_due(epoch_ms: Optional[int], now_ms: int) -> str:
    """:func:`fmt_when` and :func:`fmt_relative`: ``2026-12-06 09:34:53 (in 26 h)``."""
    if not epoch_ms:
        return "-"
    return f"{fmt_when(epoch_ms, now_ms)} ({fmt_relative(epoch_ms, now_ms)})"


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
_AFTER = ("paused", "next due", "schedules")
# narrower terminals: the same columns as two, then three, borderless tables, each
# starting with the queue names whole; the first split that fits the width is printed
_SPLITS = (
    (_COLUMNS[:7], ("expired", "waiting_deps", "paused", "next due", "schedules")),
    (_COLUMNS[:6], ("cancelled", "expired", "waiting_deps", "schedules"), ("paused", "next due")),
)


def natural_width(renderable: Any) -> int:
    """The columns ``renderable`` takes when nothing is wrapped or cut."""
    wide = Console(width=100_000)
    return Measurement.get(wide, wide.options, renderable).maximum


def _stat_cells(row: Dict[str, Any], now_ms: int) -> Dict[str, str]:
    c = row["counts"]
    cells = {s: str(c.get(s, 0)) for s in _COLUMNS}
    cells.update({"paused": "yes" if row.get("paused") else "no",
                  "next due": fmt_due(row.get("next_due_ms"), now_ms),
                  "schedules": str(row.get("schedules", "-"))})
    return cells


def _stat_style(name: str) -> str:
    return STATE_STYLES.get(name, "dim") if name in _COLUMNS else ""


def counts_table(rows: Iterable[Dict[str, Any]], now_ms: int, title: str = "Queues",
                 width: Optional[int] = None) -> Any:
    """One row per queue: counts per state (pending includes the grouped jobs waiting in
    lanes, also shown on their own), paused flag, next due job, schedules.

    ``width`` (the console's): one boxed table when it fits, else the columns split over
    two or three borderless tables whose headers and queue names are whole (never cut
    to ``sche…`` nor folded mid-name), else one block of lines per queue."""
    rows = list(rows)
    table = _counts(rows, now_ms, (*_COLUMNS, *_AFTER), title, boxed=True)
    if width is None or natural_width(table) <= width:
        return table
    for split in _SPLITS:
        tables = [_counts(rows, now_ms, names, None, boxed=False) for names in split]
        if max(natural_width(t) for t in tables) <= width:  # the title: a line of its own
            return Group(plain(title), *tables)
    return _count_blocks(rows, now_ms, title, width)


def _counts(rows: List[Dict[str, Any]], now_ms: int, names: Iterable[str],
            title: Optional[str], boxed: bool) -> Table:
    """A table of the queues' ``names`` columns (boxed, or borderless and tight)."""
    options: Dict[str, Any] = {} if boxed else {
        "box": box.SIMPLE_HEAD, "padding": (0, 0), "pad_edge": False, "show_edge": False}
    table = Table(title=None if title is None else plain(title), title_justify="left",
                  **options)
    table.add_column("queue", style="bold", overflow="fold", min_width=5)
    names = list(names)
    for name in names:
        table.add_column(name, justify="left" if name in ("paused", "next due") else "right",
                         style=_stat_style(name), no_wrap=True)
    for row in rows:
        cells = _stat_cells(row, now_ms)
        table.add_row(plain(row["queue"]), *(cells[name] for name in names))
    return table


def _count_blocks(rows: List[Dict[str, Any]], now_ms: int, title: str, width: int) -> Group:
    """:func:`counts_table` where no table fits: each queue's name on a line of its own,
    then ``name value`` pairs filling lines of ``width``."""
    parts: List[Any] = [plain(title)]
    for row in rows:
        cells = _stat_cells(row, now_ms)
        parts.append(plain(row["queue"], "bold"))
        line = Text("  ")
        for name in (*_COLUMNS, *_AFTER):
            piece = Text.assemble(f"{name} ", (cells[name], _stat_style(name)))
            if line.cell_len > 2 and line.cell_len + 2 + piece.cell_len > width:
                parts.append(line)
                line = Text("  ")
            elif line.cell_len > 2:
                line.append("  ")
            line.append_text(piece)
        parts.append(line)
    return Group(*parts)


def stats_line(row: Dict[str, Any], now_ms: int) -> str:
    """One queue's numbers as one plain ``key=value`` line, for ``stats --watch`` into a
    file or a pipe (greppable; one line per queue per refresh)."""
    c = row["counts"]
    nxt = row.get("next_due_ms")
    due = f"{fmt_ms(nxt)} ({fmt_relative(nxt, now_ms)})" if nxt else "-"
    return " ".join([fmt_ms(now_ms), f"queue={visible(row['queue'])}",
                     *(f"{s}={c.get(s, 0)}" for s in _COLUMNS),
                     f"paused={'yes' if row.get('paused') else 'no'}",
                     f"schedules={row.get('schedules', '-')}", f"next_due={due}",
                     *([f"partitions={row['partitions']}"] if row.get("partitions") else [])])


# every column (``-o wide``, or when they fit); a narrower terminal gets the compact ones
JOB_COLUMNS: Tuple[str, ...] = ("id", "state", "attempts", "prio", "created", "run at",
                                 "finished")
COMPACT_JOB_COLUMNS: Tuple[str, ...] = ("id", "state", "tries", "when")
ERROR_ROOM = (16, 60)  # the error column's least useful and greatest widths


def _job_when(job: Job, now_ms: int) -> str:
    """The one time that matters for a job in its state, relative to now: when it is due
    (scheduled), was enqueued (waiting), started (active) or ended; more than two days
    away, its date (``2030-05-01``)."""
    if job.state == "scheduled":
        when = job.run_at_ms
    elif job.state == "active":
        when = job.started_ms or job.created_ms
    else:
        when = job.finished_ms or job.created_ms
    if when is not None and abs(when - now_ms) >= 172_800_000:
        return _utc(when).strftime("%Y-%m-%d")
    return fmt_relative(when, now_ms)


def _job_cells(job: Job, now_ms: int) -> Dict[str, Any]:
    tries = f"{job.attempts}/{job.max_attempts}"
    return {"id": plain(job.id), "state": state_text(job.state), "attempts": tries,
            "tries": tries, "prio": str(job.priority),
            "created": fmt_when(job.created_ms, now_ms),
            "run at": fmt_when(job.run_at_ms, now_ms),
            "finished": fmt_when(job.finished_ms, now_ms), "when": _job_when(job, now_ms)}


def jobs_table(jobs: Iterable[Job], now_ms: int, title: Optional[str] = None,
               width: Optional[int] = None, wide: bool = False) -> Table:
    """Jobs as rows, whose ids are never cut (they are copied into ``jobs QUEUE ID``,
    ``retry`` and ``cancel``): every column when they fit ``width`` (or ``wide``:
    whatever the width), else the compact ones (id, state, tries, when: relative),
    dropping from the right while even those do not fit. The last error takes the room
    left, cut to it, or is left out below :data:`ERROR_ROOM`."""
    rows = [(_job_cells(job, now_ms), job.error) for job in jobs]
    if wide or width is None:
        return _jobs_layout(rows, title, JOB_COLUMNS, True, ERROR_ROOM[1])
    for names, boxed in ((JOB_COLUMNS, True), (COMPACT_JOB_COLUMNS, False)):
        table = _jobs_layout(rows, title, names, boxed, 0)
        room = width - natural_width(table) - (3 if boxed else 2)
        if room >= ERROR_ROOM[0]:
            return _jobs_layout(rows, title, names, boxed, min(room, ERROR_ROOM[1]))
    names = COMPACT_JOB_COLUMNS
    while len(names) > 1 and natural_width(_jobs_layout(rows, title, names, False, 0)) > width:
        names = names[:-1]
    return _jobs_layout(rows, title, names, False, 0)


def _jobs_layout(rows: List[Tuple[Dict[str, Any], Optional[str]]], title: Optional[str],
                 names: Tuple[str, ...], boxed: bool, error_width: int) -> Table:
    """The jobs table of columns ``names`` (+ the error cut to ``error_width``, if any)."""
    options: Dict[str, Any] = {} if boxed else {
        "box": box.SIMPLE_HEAD, "pad_edge": False, "show_edge": False,
        "collapse_padding": True}
    table = Table(title=None if title is None else plain(title), title_justify="left",
                  **options)
    for name in names:  # the id folds rather than be cut if it is wider than the screen
        table.add_column(name, no_wrap=name != "id",
                         overflow="fold" if name == "id" else "ellipsis")
    if error_width:
        table.add_column("error", no_wrap=True)
    for cells, error in rows:
        extra = [plain(short_error(error, error_width))] if error_width else []
        table.add_row(*(cells[name] for name in names), *extra)
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
