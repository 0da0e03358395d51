"""The dashboard's pages (GET) and the JSON its script polls for live updates.

Handlers are plain functions ``(dash, request) -> Response`` run in a worker thread by
:func:`emqfast.web.app.endpoint`; each validates its query (bad names and ids: 400),
answers an unknown queue or job with a 404 page, and renders a template."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from emqfast.core.validation import check_job_id, check_queue_name
from emqfast.facade.job import STATES as JOB_STATES
from emqfast.facade.leaderboard import Leaderboard
from emqfast.facade.partitioned import open_queue
from emqfast.facade.queue import Queue
from emqfast.web import format as fmt, reads
from emqfast.web.app import Dashboard, Handler, Problem, link
from emqfast.web.lockstep import run_many


def known_queue(dash: Dashboard, name: Any) -> str:
    """``name`` if it is a valid queue name (else 400) of a queue shown here (else 404)."""
    if name is None:
        raise Problem(400, "which queue? (the q parameter is missing)")
    check_queue_name(str(name))
    if not dash.discovery.exists(str(name)):
        raise Problem(404, f"no queue {name!r} here")
    return str(name)


def queue_param(dash: Dashboard, request: Request) -> str:
    """The ``q`` query parameter, checked by :func:`known_queue`."""
    return known_queue(dash, request.query_params.get("q"))


def job_param(request: Request) -> str:
    job_id = request.query_params.get("id")
    if job_id is None:
        raise Problem(400, "which job? (the id parameter is missing)")
    return check_job_id(job_id)


def missing_job(job_id: str, name: str) -> str:
    """Why a job id finds nothing: what really removes a job's record (a cancelled or
    expired job keeps its record until retention trims it)."""
    return (f"no job {job_id!r} in queue {name!r}: it was never enqueued here, or its record "
            "is gone: deleted, trimmed by retention (trim keeps the newest completed, "
            "failed, cancelled and expired records), or its queue was obliterated")


def _int_param(request: Request, name: str, default: int, top: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) > top:
        raise Problem(400, f"{name} must be a whole number 0..{top}")
    return int(raw)


# --- overview -------------------------------------------------------------------------
def _overview_data(dash: Dashboard) -> Dict[str, Any]:
    rows = reads.overview(dash.client, dash.discovery.names(), dash.queues)
    dash.throughput.record((r.name, r.completed_total, r.failed_total)
                           for r in rows if r.error is None)
    done, failed = dash.throughput.series()
    peak = max(done + failed + [0.0])  # one scale for both lines
    return {"rows": rows, "rates": dash.throughput.per_minute_all(),
            "chart": {"done": fmt.sparkline(done, top=peak),
                      "failed": fmt.sparkline(failed, top=peak),
                      "peak": peak, "points": len(done)}}


def overview(dash: Dashboard, request: Request) -> Response:
    data = _overview_data(dash)
    states = reads.states_of(next((r.counts for r in data["rows"] if r.counts), {}))
    return dash.render(request, "overview.html", states=states,
                       queue_link=link(request, "queue"), **data)


def _rate_text(rate: Optional[Tuple[float, float]]) -> List[str]:
    if rate is None:
        return ["—", "—"]
    return [f"{rate[0]:.1f}", f"{rate[1]:.1f}"]


def api_overview(dash: Dashboard, request: Request) -> Response:
    data = _overview_data(dash)
    rows = [{"name": r.name, "counts": r.counts, "paused": r.paused, "error": r.error,
             "rate_limit": f"{r.rate[0]} / {fmt.duration(r.rate[1])}" if r.rate else "—",
             "per_min": _rate_text(data["rates"].get(r.name))} for r in data["rows"]]
    return JSONResponse({"rows": rows, "chart": data["chart"]})


# --- one queue --------------------------------------------------------------------------
def queue(dash: Dashboard, request: Request) -> Response:
    name = queue_param(dash, request)
    state = request.query_params.get("state", "pending")
    if state not in JOB_STATES:
        raise Problem(400, f"state must be one of {', '.join(JOB_STATES)}")
    start = _int_param(request, "start", 0, 1 << 40)
    wanted = request.query_params.get("id", "").strip()
    if wanted:
        check_job_id(wanted)
        if open_queue(name, dash.client).get(wanted) is None:
            raise Problem(404, missing_job(wanted, name))
        return RedirectResponse(link(request, "job", q=name, id=wanted), 303)
    page = reads.queue_page(dash.client, name, state, start)
    hists = {h: fmt.histogram_bars(getattr(page.metrics, h).buckets) for h in ("wait", "run")}
    return dash.render(request, "queue.html", page=page, states=reads.states_of(page.counts),
                       hists=hists,
                       page_size=reads.PAGE_SIZE)


def api_queue(dash: Dashboard, request: Request) -> Response:
    """Counts and the paused flag; with ``state`` (and ``start``), the ids of that page of
    the job list too, so the page's script sees when its list changed."""
    name = queue_param(dash, request)
    q = open_queue(name, dash.client)
    state = request.query_params.get("state")
    if state is None:
        return JSONResponse({"name": name, "counts": q.counts(), "paused": q.is_paused()})
    if state not in JOB_STATES:
        raise Problem(400, f"state must be one of {', '.join(JOB_STATES)}")
    start = _int_param(request, "start", 0, 1 << 40)
    kind = type(q)
    counts, paused, ids = run_many(dash.client, [
        kind.counts.op(q), kind.is_paused.op(q),
        kind.job_ids.op(q, state, start, start + reads.PAGE_SIZE - 1)])
    for value in (counts, paused, ids):
        if isinstance(value, Exception):
            raise value
    return JSONResponse({"name": name, "counts": counts, "paused": paused, "ids": ids})


# --- one job ------------------------------------------------------------------------------
def _job_or_404(dash: Dashboard, request: Request) -> reads.JobPage:
    name = queue_param(dash, request)
    job_id = job_param(request)
    page = reads.job_page(dash.client, name, job_id)
    if page is None:
        raise Problem(404, missing_job(job_id, name))
    return page


def job(dash: Dashboard, request: Request) -> Response:
    page = _job_or_404(dash, request)
    j = page.job
    payload = fmt.preview(j.payload)
    result = fmt.preview(j.result) if j.result is not None else None
    flow = fmt.flow_graph(page.depends_on, reads.Link(j.queue, j.id, j.state), page.dependents) \
        if page.depends_on or page.dependents else None
    return dash.render(request, "job.html", page=page, job=j, payload=payload, result=result,
                       flow=flow,
                       error=fmt.cut(j.error), traceback=fmt.cut(j.traceback),
                       progress=None if j.last_progress is None else fmt.preview(j.last_progress),
                       preview_limit=fmt.PREVIEW_BYTES)


def api_job(dash: Dashboard, request: Request) -> Response:
    name = queue_param(dash, request)
    got = open_queue(name, dash.client).get(job_param(request))
    if got is None:
        raise Problem(404, "no such job")
    return JSONResponse({"state": got.state, "attempts": got.attempts})


def payload(dash: Dashboard, request: Request) -> Response:
    """The whole payload as a download (never rendered inline)."""
    name = queue_param(dash, request)
    job_id = job_param(request)
    got = open_queue(name, dash.client).get(job_id)
    if got is None:
        raise Problem(404, missing_job(job_id, name))
    body, media = fmt.download(got.payload)
    ext = "bin" if media == "application/octet-stream" else "json"
    return Response(body, media_type=media,
                    headers={"Content-Disposition": attachment(f"{job_id[:80]}.{ext}")})


def attachment(filename: str) -> str:
    """A ``Content-Disposition`` for a download named ``filename``: an ASCII fallback
    (``filename=``, anything else as ``_``) and the exact UTF-8 name (RFC 5987/6266
    ``filename*``), so any id's letters download under their own name."""
    fallback = "".join(c if c.isascii() and (c.isalnum() or c in ".-") else "_"
                       for c in filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


# --- schedules, leaderboards, workers -----------------------------------------------------
def schedules(dash: Dashboard, request: Request) -> Response:
    found = reads.schedules(dash.client, dash.discovery.names())
    return dash.render(request, "schedules.html", queues=found)


def leaderboards(dash: Dashboard, request: Request) -> Response:
    boards = reads.leaderboards(dash.client, dash.boards.names())
    lookup = None
    board, member = request.query_params.get("board"), request.query_params.get("member")
    if board and member:
        lb = Leaderboard(dash.client, board)
        rank, score = lb.rank(member), lb.score(member)
        lookup = {"board": board, "member": member, "rank": rank, "score": score}
    return dash.render(request, "leaderboards.html", boards=boards, lookup=lookup)


def workers(dash: Dashboard, request: Request) -> Response:
    found = reads.workers(dash.client, dash.discovery.names())
    return dash.render(request, "workers.html", workers=found)


ROUTES: List[Tuple[str, str, str, Handler, bool]] = [  # path, name, method, handler, public
    ("/", "overview", "GET", overview, False),
    ("/queue", "queue", "GET", queue, False),
    ("/job", "job", "GET", job, False),
    ("/job/payload", "payload", "GET", payload, False),
    ("/schedules", "schedules", "GET", schedules, False),
    ("/leaderboards", "leaderboards", "GET", leaderboards, False),
    ("/workers", "workers", "GET", workers, False),
    ("/api/overview", "api_overview", "GET", api_overview, False),
    ("/api/queue", "api_queue", "GET", api_queue, False),
    ("/api/job", "api_job", "GET", api_job, False),
]
