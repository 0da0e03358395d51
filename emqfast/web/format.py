"""How values read from Redis are shown: times, durations, payload previews and the
small SVG charts. Every function returns plain text or numbers; the templates escape it
(Jinja2 autoescape); the one exception, :func:`count_cells`, holds only ints."""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Sequence, Tuple

from markupsafe import Markup, escape

PREVIEW_BYTES = 64 * 1024  # the most of a payload, result or traceback a page shows


def when(ms: Optional[int]) -> str:
    """Epoch ms as UTC text (``2026-11-30 19:30:42.123``), or an em dash."""
    if ms is None:
        return "—"
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def duration(ms: Optional[float]) -> str:
    """A short duration: ``850 ms``, ``12.5 s``, ``3 min``, ``2.1 h``, ``4.0 d``."""
    if ms is None:
        return "—"
    ms = float(ms)
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    if ms < 1000:
        return f"{sign}{ms:.0f} ms"
    if ms < 60_000:
        return f"{sign}{ms / 1000:.1f} s"
    if ms < 3_600_000:
        return f"{sign}{ms / 60_000:.0f} min"
    if ms < 86_400_000:
        return f"{sign}{ms / 3_600_000:.1f} h"
    return f"{sign}{ms / 86_400_000:.1f} d"


# A process Worker's child events (its heartbeat's counter names) in words
CHILD_EVENTS = {"restarts": "restarted", "crash": "crashed", "kill:timeout": "killed (timeout)",
                "kill:cancel": "killed (cancel)", "kill:shutdown": "killed (shutdown)",
                "recycled:jobs": "recycled (jobs)", "recycled:memory": "recycled (memory)"}


def child_event(name: str) -> str:
    """A child event's name in words (``kill:timeout`` -> ``killed (timeout)``); a name
    this version does not know is shown as it is."""
    return CHILD_EVENTS.get(name, name)


def memory_kb(kb: Optional[int]) -> str:
    """A resident size given in KiB: ``41.3 MB``, ``812 KB``, or an em dash."""
    if kb is None:
        return "—"
    if kb < 1024:
        return f"{kb} KB"
    if kb < 1 << 20:
        return f"{kb / 1024:.1f} MB"
    return f"{kb / (1 << 20):.1f} GB"


def escaped_bytes(data: bytes) -> str:
    """Bytes as printable text: ASCII as is, everything else ``\\xNN`` (and ``\\n`` etc.)."""
    out = []
    for b in data:
        if b == 0x5C:
            out.append("\\\\")
        elif b in (0x0A, 0x09):
            out.append({0x0A: "\\n\n", 0x09: "\\t"}[b])
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out)


def preview(value: Any) -> Tuple[str, str, int, bool]:
    """``(kind, text, full size in bytes, cut)`` of a payload or result: pretty JSON, or
    bytes as an escaped preview; at most :data:`PREVIEW_BYTES` of it is shown."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return "bytes", escaped_bytes(data[:PREVIEW_BYTES]), len(data), len(data) > PREVIEW_BYTES
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
    size = len(text.encode("utf-8"))
    if size > PREVIEW_BYTES:
        text = text.encode("utf-8")[:PREVIEW_BYTES].decode("utf-8", "ignore")
    return "json", text, size, size > PREVIEW_BYTES


def cut(text: Optional[str], limit: int = PREVIEW_BYTES) -> Tuple[str, bool]:
    """``text`` cut to ``limit`` characters, and whether it was cut."""
    if text is None:
        return "", False
    return (text[:limit], True) if len(text) > limit else (text, False)


def download(value: Any) -> Tuple[bytes, str]:
    """The whole payload as a file: ``(body, media type)``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), "application/octet-stream"
    return json.dumps(value, ensure_ascii=False).encode("utf-8"), "application/json"


def count_cells(counts: Dict[str, int], states: Sequence[str]) -> Markup:
    """The overview's count cells of one queue (``states``, then ``grouped``), built here
    because 1,000 queues x 8 cells is most of the page's template time. Only ints go in
    (``int()`` of each count) and the state names are the library's own, escaped anyway."""
    layout = _LAYOUTS.get(tuple(states)) or _layout(tuple(states))
    get = counts.get
    return Markup("".join([f"{zero if n == 0 else some}{n}</td>" for state, zero, some in layout
                           for n in (int(get(state, 0)),)]))


_LAYOUTS: Dict[Tuple[str, ...], List[Tuple[str, str, str]]] = {}


def _layout(states: Tuple[str, ...]) -> List[Tuple[str, str, str]]:
    """Per column: the state, and the cell's opening tag for a zero and a non-zero count."""
    out = []
    for state in states + ("grouped",):
        label = escape(state.replace("_", " "))  # shown beside the count on a phone
        plain = f'<td class="num" data-label="{label}" data-k="{escape(state)}">'
        out.append((state, plain, plain.replace('"num"', '"num bad"') if state == "failed"
                    else plain))
    _LAYOUTS[states] = out
    return out


def sparkline(values: Sequence[float], width: int = 300, height: int = 60,
              slots: int = 120, top: Optional[float] = None) -> str:
    """SVG path data (``M x y L ...``) of ``values`` in a width x height box (y grows
    downwards), the newest at the right edge and one of ``slots`` steps apart, so a young
    series fills in from the right instead of stretching; ``top`` is the scale's maximum
    (default: the largest value)."""
    if not values:
        return ""
    values = list(values)[-slots:]
    top = max(top if top is not None else max(values), 1e-9)
    step = width / max(slots - 1, 1)
    first = width - (len(values) - 1) * step
    points = [(first + i * step, height - (v / top) * (height - 2) - 1)
              for i, v in enumerate(values)]
    return "M" + " L".join(f"{x:.1f} {y:.1f}" for x, y in points)


def histogram_bars(buckets: Sequence[Tuple[float, int]], width: int = 300,
                   height: int = 80) -> List[Dict[str, Any]]:
    """Bars of a cumulative histogram (``(bound ms, count)`` pairs): one per bucket with its
    own count, as SVG rect geometry plus a label."""
    counts, previous = [], 0
    for bound, total in buckets:
        counts.append((bound, total - previous))
        previous = total
    top = max([n for _, n in counts] + [1])
    slot = width / max(len(counts), 1)
    bars = []
    for i, (bound, n) in enumerate(counts):
        h = 0 if n == 0 else max(1.0, (n / top) * (height - 14))
        label = "∞" if math.isinf(bound) else duration(bound)
        bars.append({"x": round(i * slot + 1, 1), "w": round(max(slot - 2, 1), 1),
                     "y": round(height - 12 - h, 1), "h": round(h, 1), "n": n,
                     "label": f"≤ {label}: {n}"})
    return bars


def _clip(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most - 1] + "…"


FLOW_SIDE = 12  # nodes drawn on each side of a flow graph (the lists below hold them all)


def flow_graph(before: Sequence[Any], center: Any, after: Sequence[Any]) -> Dict[str, Any]:
    """Geometry of a job's small flow graph: the jobs it depends on (left), the job, the
    jobs waiting on it (right; an empty side takes no room), each a box (``x``, ``y``,
    ``w``, ``h``, its ``job``, its queue and id cut to fit) and the edges as SVG path data
    with the state of the job at their far end. Only numbers and the jobs' own strings go
    out; the template escapes them."""
    w, h, gap, step = 210, 36, 10, 250
    sides = [list(before)[:FLOW_SIDE], list(after)[:FLOW_SIDE]]
    height = max(len(sides[0]), len(sides[1]), 1) * (h + gap) + gap
    x_mid = 4 + (step if sides[0] else 0)

    def column(items: List[Any], x: int) -> List[Dict[str, Any]]:
        top = (height - len(items) * (h + gap) + gap) / 2
        return [{"x": x, "y": round(top + i * (h + gap), 1), "w": w, "h": h, "job": item,
                 "queue": _clip(item.queue, 32), "label": _clip(item.id, 28)}
                for i, item in enumerate(items)]
    left, right = column(sides[0], 4), column(sides[1], x_mid + step)
    mid = column([center], x_mid)[0]
    cy = mid["y"] + h / 2

    def edge(x1: float, y1: float, x2: float, y2: float, state: Optional[str]) -> Dict[str, str]:
        bend = (x2 - x1) / 2
        return {"d": f"M{x1} {y1:.1f} C{x1 + bend} {y1:.1f} {x2 - bend} {y2:.1f} {x2} {y2:.1f}",
                "state": state or "gone"}
    edges = [edge(n["x"] + w, n["y"] + h / 2, x_mid, cy, n["job"].state) for n in left] + \
        [edge(x_mid + w, cy, n["x"], n["y"] + h / 2, n["job"].state) for n in right]
    return {"nodes": left + [mid] + right, "center": mid, "edges": edges,
            "width": (right[0]["x"] if right else x_mid) + w + 4, "height": height,
            "more": (len(before) - len(sides[0]), len(after) - len(sides[1]))}
