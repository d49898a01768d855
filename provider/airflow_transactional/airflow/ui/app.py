"""The API and pages behind the Transactions views, a FastAPI app the api-server mounts at
:data:`PREFIX`.

Airflow mounts a plugin's app without authentication, so every route here asks for the Airflow
user first (the same token or session cookie the UI sends; 401 without one) and for read access
to the topology's DAG through Airflow's auth manager (403 without it). The list of topologies
holds only those whose DAG the user may read: a user without access to a DAG cannot learn that
its topology exists. No DSN or secret is ever sent: the state store is reached through the
Airflow connection ``[transactional] conn_id`` (default ``transactional_default``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ...connections import CONNECTION_ERRORS, redact
from ...coordinator import Coordinator
from ...exceptions import ActionRefused
from ..hooks import TransactionalHook
from . import actions, pages, previews, waits
from .actions import AirflowApi

PREFIX = pages.PLUGIN_PREFIX
#: How many txids a topology's timeline shows.
TIMELINE = 30

_bearer = HTTPBearer(auto_error=False)

#: Sent with every response: no content sniffing, and framed only by the Airflow UI itself (same origin).
SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "frame-ancestors 'self'"}
#: A spreadsheet runs a cell that starts with one of these as a formula (CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """``value`` safe for a spreadsheet: text that would start a formula gets a leading ``'``."""
    return f"'{value}" if isinstance(value, str) and value.startswith(_FORMULA_START) else value


def has_nul(request: Request) -> bool:
    """Whether the decoded path or query holds a NUL byte (no id of Airflow's or ours can)."""
    return "\x00" in str(request.scope.get("path", "")) or any(
        "\x00" in key or "\x00" in value for key, value in request.query_params.multi_items())


async def signed_in(request: Request,
                    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Any:
    """The Airflow user of this request, as Airflow's own API finds it (the bearer token, else
    the UI's session cookie); 401 without one. Airflow's API modules are imported here, in the
    api-server, not when the plugin loads (every Airflow process loads plugins)."""
    from airflow.api_fastapi.core_api.security import get_user

    return await get_user(request, None, bearer)


User = Annotated[Any, Depends(signed_in)]
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def credential(request: Request, bearer: HTTPAuthorizationCredentials | None) -> str:
    """The credential the user signed in with (the one :func:`signed_in` accepted): the actions
    call Airflow's REST API with it, so they are done as this user."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    if bearer and bearer.scheme.lower() == "bearer":
        return bearer.credentials
    return request.cookies.get(COOKIE_NAME_JWT_TOKEN, "")


def confirmed(request: Request, bearer: HTTPAuthorizationCredentials | None, action: str, dag_id: str,
              target: str, token: str | None) -> str:
    """The user's credential, once the request is known to come from our own preview: a bearer
    token is never sent by a browser on its own; a request riding on the session cookie must
    carry the preview form's token (403 otherwise: a forged post from another page)."""
    cred = credential(request, bearer)
    if not (bearer and bearer.scheme.lower() == "bearer") and not actions.form_token_ok(
            cred, action, dag_id, target, token):
        raise HTTPException(403, "this action must be confirmed from its preview page (or what it would do has "
                                 "changed since the preview: open the preview again)")
    return cred


def auth_manager() -> Any:
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager()


@contextmanager
def store() -> Iterator[Coordinator]:
    from airflow.configuration import conf

    conn_id = conf.get("transactional", "conn_id", fallback="transactional_default")
    try:
        coordinator = TransactionalHook(conn_id).coordinator()
    except Exception as exc:  # the connection is not defined or cannot be read
        why = redact(str(exc))
        raise HTTPException(503, f"the state store's Airflow connection {conn_id!r} is not usable ({why}): add it "
                                 "under Admin > Connections, or name another one in [transactional] conn_id") from None
    with coordinator:
        try:
            yield coordinator
        except CONNECTION_ERRORS as exc:
            raise HTTPException(503, f"the state store cannot be reached: {redact(str(exc))}") from None


def readable(user: Any, dag_id: str) -> None:
    """403 unless ``user`` may read DAG ``dag_id`` (asked before anything about it is looked up)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
    from airflow.models.dag import DagModel

    # The DAG's team (multi-team mode) is part of the question, as in Airflow's own routes.
    details = DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id))
    if not auth_manager().is_authorized_dag(method="GET", details=details, user=user):
        raise HTTPException(403, "Forbidden")


def may_trigger(user: Any, dag_id: str) -> bool:
    """Whether ``user`` may trigger runs of DAG ``dag_id`` (a page offers the button only then)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.models.dag import DagModel

    details = DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id))
    return bool(auth_manager().is_authorized_dag(method="POST", access_entity=DagAccessEntity.RUN, details=details,
                                                 user=user))


def _topology_of(coordinator: Coordinator, dag_id: str) -> str | None:
    for spec in coordinator.topologies():
        if spec.dag == dag_id:
            return spec.topology_id
    return None


def overview(user: Any) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    with store() as coordinator:
        by_dag = {s.dag: s.topology_id for s in coordinator.topologies()}
        allowed = set(by_dag) & auth_manager().get_authorized_dag_ids(user=user, method="GET")
        coordinator.ask_lags([by_dag[d] for d in sorted(allowed)])  # at once: the page waits for the slowest
        return [with_waits(user, coordinator.summary(by_dag[d], dag_id=d, now=now), now) for d in sorted(allowed)]


def with_waits(user: Any, summary: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A topology's summary with what Airflow holds each in-flight run for (``waiting``); a
    pool's use only for a user who may read that pool."""
    from airflow.api_fastapi.auth.managers.models.resource_details import PoolDetails

    def may_read_pool(name: str, team: str | None) -> bool:
        return bool(auth_manager().is_authorized_pool(method="GET", user=user,
                                                      details=PoolDetails(name=name, team_name=team)))

    said = waits.waiting(summary["dag_id"], [f["run_id"] for f in summary["in_flight"]], now, may_read_pool)
    for f in summary["in_flight"]:
        f["waiting"] = said.get(f["run_id"])
    return summary


def topology(user: Any, dag_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    readable(user, dag_id)
    with store() as coordinator:
        tid = _topology_of(coordinator, dag_id)
        if tid is None:
            return None
        now = datetime.now(UTC)
        return (with_waits(user, coordinator.summary(tid, dag_id=dag_id, now=now), now),
                coordinator.timeline(tid, TIMELINE))


def run(user: Any, dag_id: str, run_id: str) -> tuple[str, dict[str, Any] | None]:
    readable(user, dag_id)
    with store() as coordinator:
        tid = _topology_of(coordinator, dag_id)
        if tid is None:
            raise HTTPException(404, f"DAG {dag_id} is not a transactional topology")
        return tid, coordinator.run_view(tid, run_id)


def quarantined(user: Any, dag_id: str, run_id: str, reason: str | None, limit: int,
                offset: int) -> list[dict[str, Any]]:
    tid, txn = run(user, dag_id, run_id)
    if txn is None:
        raise HTTPException(404, f"run {run_id} has no transaction")
    with store() as coordinator:
        return coordinator.quarantined(tid, txn["txid"], reason=reason or None, limit=limit, offset=offset)


@contextmanager
def airflow_as(cred: str) -> Iterator[AirflowApi]:
    """Airflow's REST API as the user; what Airflow refuses becomes this request's answer."""
    try:
        with AirflowApi(cred) as api:
            yield api
    except ActionRefused as exc:
        raise HTTPException(exc.status if exc.status in (400, 403, 404, 409, 422) else 502, exc.detail) from None


def clear_plan(user: Any, cred: str, dag_id: str, run_id: str) -> actions.ClearPlan:
    tid = run(user, dag_id, run_id)[0]
    with store() as coordinator, airflow_as(cred) as api:
        return actions.plan_clear(api, coordinator, tid, dag_id, run_id)


def reprocess_plan(user: Any, cred: str, dag_id: str) -> actions.ReprocessPlan:
    readable(user, dag_id)
    with store() as coordinator, airflow_as(cred) as api:
        tid = _topology_of(coordinator, dag_id)
        if tid is None:
            raise HTTPException(404, f"DAG {dag_id} is not a transactional topology")
        return actions.plan_reprocess(api, coordinator, tid, dag_id)


def do_clear(cred: str, plan: actions.ClearPlan) -> int:
    with airflow_as(cred) as api:
        return actions.clear(api, plan.dag_id, plan.run_id, plan.txid)


def do_reprocess(cred: str, plan: actions.ReprocessPlan) -> dict[str, Any]:
    if plan.problem:
        raise HTTPException(409, plan.problem)
    with airflow_as(cred) as api:
        return actions.reprocess(api, plan)


def _range(plan: actions.ReprocessPlan) -> str:
    return f"{plan.from_date}/{plan.to_date}/{plan.max_active_runs}"


router = APIRouter()


def base(request: Request) -> str:
    """Where the plugin is mounted (the pages' links start there)."""
    return str(request.scope.get("root_path") or PREFIX).rstrip("/")


@router.get("/api/topologies")
def api_topologies(user: User) -> list[dict[str, Any]]:
    return overview(user)


@router.get("/api/dags/{dag_id}")
def api_topology(user: User, dag_id: str) -> dict[str, Any]:
    found = topology(user, dag_id)
    if found is None:
        raise HTTPException(404, f"DAG {dag_id} is not a transactional topology")
    return {"summary": found[0], "timeline": found[1]}


@router.get("/api/dags/{dag_id}/runs/{run_id}")
def api_run(user: User, dag_id: str, run_id: str) -> dict[str, Any]:
    txn = run(user, dag_id, run_id)[1]
    if txn is None:
        raise HTTPException(404, f"run {run_id} has no transaction")
    return txn


@router.get("/api/dags/{dag_id}/runs/{run_id}/quarantine")
def api_quarantine(user: User, dag_id: str, run_id: str, reason: str | None = None,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                   offset: Annotated[int, Query(ge=0)] = 0) -> list[dict[str, Any]]:
    return quarantined(user, dag_id, run_id, reason, limit, offset)


@router.get("/api/dags/{dag_id}/runs/{run_id}/quarantine.csv")
def api_quarantine_csv(user: User, dag_id: str, run_id: str, reason: str | None = None) -> Response:
    rows = quarantined(user, dag_id, run_id, reason, 1_000_000, 0)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["txid", "attempt", "source_offset", "event_id", "reason", "record", "committed"])
    for r in rows:
        writer.writerow([csv_cell(r[c]) for c in ("txid", "attempt", "source_offset", "event_id", "reason",
                                                  "record", "committed")])
    name = f"quarantine-{dag_id}-{rows[0]['txid'] if rows else 'none'}.csv".replace('"', "")
    return Response(out.getvalue(), media_type="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


# -- actions: a preview (Airflow's dry run), then the action, both as the signed-in user --


@router.post("/api/dags/{dag_id}/runs/{run_id}/clear")
def api_clear(request: Request, user: User, bearer: Bearer, dag_id: str, run_id: str,
              dry_run: Annotated[bool, Body(embed=True)] = True,
              token: Annotated[str | None, Body(embed=True)] = None) -> dict[str, Any]:
    plan = clear_plan(user, credential(request, bearer), dag_id, run_id)
    if dry_run:
        return {"dry_run": True, **asdict(plan)}
    cred = confirmed(request, bearer, "clear", dag_id, run_id, token)
    return {"dry_run": False, **asdict(plan), "cleared": do_clear(cred, plan)}


@router.post("/api/dags/{dag_id}/reprocess")
def api_reprocess(request: Request, user: User, bearer: Bearer, dag_id: str,
                  dry_run: Annotated[bool, Body(embed=True)] = True,
                  token: Annotated[str | None, Body(embed=True)] = None) -> dict[str, Any]:
    plan = reprocess_plan(user, credential(request, bearer), dag_id)
    if dry_run:
        return {"dry_run": True, **asdict(plan)}
    cred = confirmed(request, bearer, "reprocess", dag_id, _range(plan), token)
    return {"dry_run": False, **asdict(plan), "backfill": do_reprocess(cred, plan)}


def shown(request: Request, make: Callable[[], Response | str]) -> Response:
    """An action page, or what stopped it as a page (not JSON) with the same status."""
    try:
        out = make()
    except HTTPException as exc:
        return HTMLResponse(previews.refused(base(request), exc.status_code, str(exc.detail)), exc.status_code)
    return HTMLResponse(out) if isinstance(out, str) else out


@router.get("/dags/{dag_id}/runs/{run_id}/clear", response_class=HTMLResponse)
def clear_page(request: Request, user: User, bearer: Bearer, dag_id: str, run_id: str) -> Response:
    def make() -> str:
        cred = credential(request, bearer)
        plan = clear_plan(user, cred, dag_id, run_id)
        return previews.clear_preview(base(request), plan, actions.form_token(cred, "clear", dag_id, run_id))
    return shown(request, make)


@router.post("/dags/{dag_id}/runs/{run_id}/clear")
def clear_form(request: Request, user: User, bearer: Bearer, dag_id: str, run_id: str,
               token: Annotated[str, Form()] = "") -> Response:
    def make() -> Response:
        cred = confirmed(request, bearer, "clear", dag_id, run_id, token)
        cleared = do_clear(cred, clear_plan(user, cred, dag_id, run_id))
        return RedirectResponse(f"{base(request)}{pages.run_path(dag_id, run_id)}?cleared={cleared}", 303)
    return shown(request, make)


@router.get("/dags/{dag_id}/reprocess", response_class=HTMLResponse)
def reprocess_page(request: Request, user: User, bearer: Bearer, dag_id: str) -> Response:
    def make() -> str:
        cred = credential(request, bearer)
        plan = reprocess_plan(user, cred, dag_id)
        return previews.reprocess_preview(base(request), plan,
                                       actions.form_token(cred, "reprocess", dag_id, _range(plan)))
    return shown(request, make)


@router.post("/dags/{dag_id}/reprocess")
def reprocess_form(request: Request, user: User, bearer: Bearer, dag_id: str,
                   token: Annotated[str, Form()] = "") -> Response:
    def make() -> Response:
        cred = credential(request, bearer)
        plan = reprocess_plan(user, cred, dag_id)
        # The token was made for the range the preview showed: a range that moved since is refused.
        confirmed(request, bearer, "reprocess", dag_id, _range(plan), token)
        backfill = do_reprocess(cred, plan)
        return RedirectResponse(f"{base(request)}{pages.dag_path(dag_id)}?backfill={int(backfill['id'])}", 303)
    return shown(request, make)


@router.get("/", response_class=HTMLResponse)
def transactions_page(request: Request, user: User) -> str:
    return pages.transactions(base(request), overview(user))


@router.get("/dags/{dag_id}", response_class=HTMLResponse)
def topology_page(request: Request, user: User, dag_id: str, backfill: int | None = None) -> str:
    found = topology(user, dag_id)
    if found is None:
        return pages.not_transactional(dag_id)
    return pages.topology(base(request), found[0], found[1], datetime.now(UTC), backfill=backfill)


@router.get("/dags/{dag_id}/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, user: User, dag_id: str, run_id: str, reason: str | None = None,
             cleared: int | None = None, page: Annotated[int, Query(ge=0, le=1_000_000)] = 0) -> str:
    readable(user, dag_id)
    with store() as coordinator:
        if _topology_of(coordinator, dag_id) is None:
            return pages.not_transactional(dag_id)
    txn = run(user, dag_id, run_id)[1]
    records = (quarantined(user, dag_id, run_id, reason, pages.QUARANTINE_PAGE, page * pages.QUARANTINE_PAGE)
               if txn and txn["quarantine_reasons"] else [])
    return pages.run(base(request), dag_id, run_id, txn, records, reason or None, cleared=cleared, at_page=page)
