"""The dashboard's actions (POST + CSRF token) and the login form.

Every action is a :class:`emqfast.Queue` method (retry, cancel, promote_job, delete,
pause/resume, promote, trim, obliterate) or ``queue.schedules.remove``: the dashboard never writes a key itself.
An action refused by the job's state (retry of a job that is not failed, cancel of a
running one, promote of a job that is not scheduled, delete of an active one) changes nothing and comes back as the typed error's message; read-only
mode refuses every action with 403. Each answers with a redirect (post/redirect/get)
and a flash message."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from emqfast.core.errors import InvalidInput, JobNotFound, JobStateError
from emqfast.core.redaction import redact
from emqfast.core.validation import check_job_id, check_schedule_name
from emqfast.facade.control import CancelResult
from emqfast.facade.job import STATES
from emqfast.facade.partitioned import open_queue
from emqfast.facade.queue import Queue
from emqfast.tools.cli_jobs import retry_every
from emqfast.web.app import (Dashboard, Handler, Problem, app_root, client_of, cookie_path,
                             flash, link, safe_next)
from emqfast.web.pages import known_queue
from emqfast.web.security import AUTH_COOKIE, SESSION_TTL_S

MAX_SELECTED = 500  # ids one bulk action takes
Outcome = Tuple[str, str]  # (flash kind, message)


def _writable(dash: Dashboard) -> None:
    if dash.read_only:
        raise Problem(403, "this dashboard is read-only: actions are turned off")


def _typed(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {redact(str(exc))}"


def _int_field(form: Any, name: str, default: int) -> int:
    raw = str(form.get(name, "") or "").strip()
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 12:
        raise InvalidInput(f"{name} must be a whole number")
    return int(raw)


ASKED = "asked the worker running"  # a cancel of a running job: its page stays


def _cancel(q: Queue, job_id: str) -> Outcome:
    answer = q.cancel(job_id)
    if answer == CancelResult.REQUESTED:  # running: its worker stops it and records it
        return "ok", f"{ASKED} {job_id} to cancel it"
    if answer:
        return "ok", f"cancelled {job_id}"
    job = q.get(job_id)
    state = "unknown" if job is None else job.state
    err = JobStateError(f"job {job_id} is {state}: only a waiting or running job can be "
                        "cancelled")
    return "error", _typed(err)


def _retry(q: Queue, job_id: str) -> Outcome:
    q.retry(job_id)
    return "ok", f"{job_id} is pending again"


def _promote(q: Queue, job_id: str) -> Outcome:
    q.promote_job(job_id)
    return "ok", f"{job_id} is due now"


def _delete(q: Queue, job_id: str) -> Outcome:
    q.delete(job_id)
    return "ok", f"deleted {job_id}"


JOB_ACTIONS: Dict[str, Callable[[Queue, str], Outcome]] = {
    "retry": _retry, "cancel": _cancel, "promote": _promote, "delete": _delete}


def job_action(dash: Dashboard, request: Request, form: Any) -> Response:
    """Retry, cancel, promote or delete one job; back to its page (or the queue's, once
    it is cancelled or deleted)."""
    _writable(dash)
    name = known_queue(dash, form.get("q"))
    job_id = check_job_id(str(form.get("id", "")))
    action = JOB_ACTIONS.get(str(form.get("action", "")))
    if action is None:
        raise Problem(400, "unknown job action")
    kind, text = _try(action, open_queue(name, dash.client), job_id)
    gone = kind == "ok" and form.get("action") in ("cancel", "delete") and \
        not text.startswith(ASKED)  # a running job stays until its worker ends it
    target = link(request, "queue", q=name) if gone else link(request, "job", q=name, id=job_id)
    return flash(RedirectResponse(target, 303), request, kind, text)


def _bulk(q: Queue, form: Any, action: str) -> Outcome:
    ids: List[str] = [check_job_id(str(i)) for i in form.getlist("ids")][:MAX_SELECTED]
    if not ids:
        return "error", "no job selected"
    done, refused = 0, []
    for job_id in ids:
        kind, text = _try(JOB_ACTIONS[action], q, job_id)
        if kind == "ok":
            done += 1
        else:
            refused.append(text)
    verb = "retried" if action == "retry" else "cancelled"
    if refused:
        return "error", f"{verb} {done} of {len(ids)}; refused: " + "; ".join(refused[:3])
    return "ok", f"{verb} {done} job(s)"


def _try(act: Callable[[Queue, str], Outcome], q: Queue, job_id: str) -> Outcome:
    """``act`` on one job; a refusal by the job's state (nothing written) as a message."""
    try:
        return act(q, job_id)
    except (JobStateError, JobNotFound) as exc:
        return "error", _typed(exc)


def _queue_outcome(q: Queue, action: str, form: Any) -> Outcome:
    if action == "pause":
        q.pause()
        return "ok", f"paused {q.name}: workers claim nothing until it is resumed"
    if action == "resume":
        q.resume()
        return "ok", f"resumed {q.name}"
    if action == "promote":
        return "ok", f"promoted {q.promote(limit=100_000)} due job(s)"
    if action == "retry_all":
        retried, skipped = retry_every(q)
        skipped_text = f", skipped {skipped}" if skipped else ""
        return "ok", f"retried {retried} failed job(s){skipped_text}"
    if action == "trim":
        removed = q.trim(keep_completed=_int_field(form, "keep_completed", 1000),
                         keep_failed=_int_field(form, "keep_failed", 10_000))
        return "ok", f"trimmed {removed} finished job(s)"
    if action in ("retry_selected", "cancel_selected"):
        return _bulk(q, form, action.split("_")[0])
    raise Problem(400, "unknown queue action")


def queue_action(dash: Dashboard, request: Request, form: Any) -> Response:
    """A queue-wide or bulk action; back to the queue page (the overview once deleted)."""
    _writable(dash)
    name = known_queue(dash, form.get("q"))
    action = str(form.get("action", ""))
    state = str(form.get("state", ""))
    back = link(request, "queue", q=name, state=state if state in STATES else None)
    q = open_queue(name, dash.client)
    row = str(form.get("row", ""))
    if row:  # a per-row button of the job list: "<verb>:<id>", verb a JOB_ACTIONS key
        verb, _, job_id = row.partition(":")
        if verb not in JOB_ACTIONS:
            raise Problem(400, "unknown job action")
        kind, text = _try(JOB_ACTIONS[verb], q, check_job_id(job_id))
        return flash(RedirectResponse(back, 303), request, kind, text)
    if action == "delete":
        if form.get("confirm") != name:
            return flash(RedirectResponse(back, 303), request, "error",
                         "type the queue's name to delete it")
        removed = q.obliterate()
        dash.discovery.names(fresh=True)
        return flash(RedirectResponse(link(request, "overview"), 303), request, "ok",
                     f"deleted queue {name} ({removed} keys)")
    try:
        kind, text = _queue_outcome(q, action, form)
    except (JobStateError, JobNotFound) as exc:
        kind, text = "error", _typed(exc)
    return flash(RedirectResponse(back, 303), request, kind, text)


def schedule_remove(dash: Dashboard, request: Request, form: Any) -> Response:
    _writable(dash)
    name = known_queue(dash, form.get("q"))
    schedule = check_schedule_name(str(form.get("name", "")))
    removed = open_queue(name, dash.client).schedules.remove(schedule)
    text = f"removed schedule {schedule} of {name}" if removed else f"no schedule {schedule}"
    return flash(RedirectResponse(link(request, "schedules"), 303), request,
                 "ok" if removed else "error", text)


# --- login ----------------------------------------------------------------------------
def _back_to(request: Request, raw: Any) -> str:
    """Where a login goes: the page asked for (a path of this dashboard only, see
    :func:`~emqfast.web.app.safe_next`), else the overview."""
    path = safe_next(raw)
    return app_root(request) + path if path else link(request, "overview")


def login_page(dash: Dashboard, request: Request) -> Response:
    asked = request.query_params.get("next")
    if not dash.guard.enabled or dash.guard.allows(request.headers, request.cookies):
        return RedirectResponse(_back_to(request, asked), 303)  # nothing to log in to
    return dash.render(request, "login.html", next=safe_next(asked))


def login(dash: Dashboard, request: Request, form: Any) -> Response:
    asked = form.get("next")
    if not dash.guard.enabled:
        return RedirectResponse(_back_to(request, asked), 303)
    if not dash.guard.check_token(str(form.get("token", ""))):
        dash.guard.throttle.failed(client_of(request))
        return dash.render(request, "login.html", status=401, failed=True,
                           next=safe_next(asked))
    response = RedirectResponse(_back_to(request, asked), 303)
    dash.guard.end_session(request.cookies.get(AUTH_COOKIE))  # a new id per login
    response.set_cookie(AUTH_COOKIE, dash.guard.new_session(), path=cookie_path(request),
                        max_age=SESSION_TTL_S, httponly=True, samesite="strict")
    return response


def logout(dash: Dashboard, request: Request, form: Any) -> Response:
    """End the session: its cookie is revoked here, not only deleted in the browser."""
    dash.guard.end_session(request.cookies.get(AUTH_COOKIE))
    response = RedirectResponse(link(request, "login"), 303)
    response.delete_cookie(AUTH_COOKIE, path=cookie_path(request))
    return response


ROUTES: List[Tuple[str, str, str, Handler, bool]] = [  # as pages.ROUTES
    ("/job/action", "job_action", "POST", job_action, False),
    ("/queue/action", "queue_action", "POST", queue_action, False),
    ("/schedules/remove", "schedule_remove", "POST", schedule_remove, False),
    ("/login", "login", "GET", login_page, True),
    ("/login", "login_post", "POST", login, True),
    ("/logout", "logout", "POST", logout, False),
]
