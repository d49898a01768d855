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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..coordinator import Coordinator
from ..exceptions import UnknownTopology
from ..hooks import TransactionalHook
from ..store.connection import CONNECTION_ERRORS, redact
from . import pages

PREFIX = "/transactional"
#: How many txids a topology's timeline shows.
TIMELINE = 30

_bearer = HTTPBearer(auto_error=False)


async def signed_in(request: Request,
                    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Any:
    """The Airflow user of this request, as Airflow's own API finds it (the bearer token, else
    the UI's session cookie); 401 without one. Airflow's API modules are imported here, in the
    api-server, not when the plugin loads (every Airflow process loads plugins)."""
    from airflow.api_fastapi.core_api.security import get_user

    return await get_user(request, None, bearer)


User = Annotated[Any, Depends(signed_in)]


def auth_manager() -> Any:
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager()


@contextmanager
def store() -> Iterator[Coordinator]:
    from airflow.configuration import conf

    conn_id = conf.get("transactional", "conn_id", fallback="transactional_default")
    try:
        coordinator = TransactionalHook(conn_id).get_coordinator()
    except Exception as exc:  # the connection is not defined or cannot be read
        why = redact(str(exc))
        raise HTTPException(503, f"the state store's Airflow connection {conn_id!r} is not usable ({why}): add it "
                                 "under Admin > Connections, or name another one in [transactional] conn_id") from None
    try:
        yield coordinator
    except CONNECTION_ERRORS as exc:
        raise HTTPException(503, f"the state store cannot be reached: {redact(str(exc))}") from None
    finally:
        coordinator.close()


def readable(user: Any, dag_id: str) -> None:
    """403 unless ``user`` may read DAG ``dag_id`` (asked before anything about it is looked up)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    if not auth_manager().is_authorized_dag(method="GET", details=DagDetails(id=dag_id), user=user):
        raise HTTPException(403, "Forbidden")


def _topology_of(coordinator: Coordinator, dag_id: str) -> str | None:
    for spec in coordinator.topologies():
        if str(spec.extra.get("dag_id") or spec.topology_id) == dag_id:
            return spec.topology_id
    return None


def overview(user: Any) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    with store() as coordinator:
        by_dag = {str(s.extra.get("dag_id") or s.topology_id): s.topology_id for s in coordinator.topologies()}
        allowed = auth_manager().filter_authorized_dag_ids(dag_ids=set(by_dag), user=user, method="GET")
        return [coordinator.summary(by_dag[d], dag_id=d, now=now) for d in sorted(allowed)]


def topology(user: Any, dag_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    readable(user, dag_id)
    with store() as coordinator:
        tid = _topology_of(coordinator, dag_id)
        if tid is None:
            return None
        return (coordinator.summary(tid, dag_id=dag_id, now=datetime.now(UTC)),
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


def create_app() -> FastAPI:
    app = FastAPI(title="Transactional", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(UnknownTopology)
    def _unknown(request: Request, exc: UnknownTopology) -> Response:
        return Response(str(exc), status_code=404)

    def base(request: Request) -> str:
        return str(request.scope.get("root_path") or PREFIX).rstrip("/")

    @app.get("/api/topologies")
    def api_topologies(user: User) -> list[dict[str, Any]]:
        return overview(user)

    @app.get("/api/dags/{dag_id}")
    def api_topology(user: User, dag_id: str) -> dict[str, Any]:
        found = topology(user, dag_id)
        if found is None:
            raise HTTPException(404, f"DAG {dag_id} is not a transactional topology")
        return {"summary": found[0], "timeline": found[1]}

    @app.get("/api/dags/{dag_id}/runs/{run_id}")
    def api_run(user: User, dag_id: str, run_id: str) -> dict[str, Any]:
        txn = run(user, dag_id, run_id)[1]
        if txn is None:
            raise HTTPException(404, f"run {run_id} has no transaction")
        return txn

    @app.get("/api/dags/{dag_id}/runs/{run_id}/quarantine")
    def api_quarantine(user: User, dag_id: str, run_id: str, reason: str | None = None,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                       offset: Annotated[int, Query(ge=0)] = 0) -> list[dict[str, Any]]:
        return quarantined(user, dag_id, run_id, reason, limit, offset)

    @app.get("/api/dags/{dag_id}/runs/{run_id}/quarantine.csv")
    def api_quarantine_csv(user: User, dag_id: str, run_id: str, reason: str | None = None) -> Response:
        rows = quarantined(user, dag_id, run_id, reason, 1_000_000, 0)
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["txid", "attempt", "source_offset", "event_id", "reason", "record", "committed"])
        for r in rows:
            writer.writerow([r["txid"], r["attempt"], r["source_offset"], r["event_id"], r["reason"], r["record"],
                             r["committed"]])
        name = f"quarantine-{dag_id}-{rows[0]['txid'] if rows else 'none'}.csv".replace('"', "")
        return Response(out.getvalue(), media_type="text/csv",
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @app.get("/", response_class=HTMLResponse)
    def transactions_page(request: Request, user: User) -> str:
        return pages.transactions(base(request), overview(user))

    @app.get("/dags/{dag_id}", response_class=HTMLResponse)
    def topology_page(request: Request, user: User, dag_id: str) -> str:
        found = topology(user, dag_id)
        if found is None:
            return pages.not_transactional(dag_id)
        return pages.topology(base(request), found[0], found[1], datetime.now(UTC))

    @app.get("/dags/{dag_id}/runs/{run_id}", response_class=HTMLResponse)
    def run_page(request: Request, user: User, dag_id: str, run_id: str, reason: str | None = None) -> str:
        readable(user, dag_id)
        with store() as coordinator:
            if _topology_of(coordinator, dag_id) is None:
                return pages.not_transactional(dag_id)
        txn = run(user, dag_id, run_id)[1]
        records = quarantined(user, dag_id, run_id, reason, 200, 0) if txn and txn["quarantine_reasons"] else []
        return pages.run(base(request), dag_id, run_id, txn, records, reason or None)

    return app
