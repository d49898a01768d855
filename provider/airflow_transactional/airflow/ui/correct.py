"""The Transactions view's correction action: a preview of a correction of committed txids A..B --
why it would be refused, what it re-reads, what those txids applied to each state, and what the
last preview of it (``airflow-txn correct``, the topology's own job under the code deployed then)
found would change -- then the button that triggers the correction: a run of the topology's DAG
with the conf ``{"correct": "A..B"}``, through Airflow's REST API as the signed-in user (as the
*Trigger DAG* form would), so Airflow's permissions and audit log apply.

Nothing here runs Spark: the api-server stays a web server. The correction run itself plans,
processes and commits like any txid (``core/corrections.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Body, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ...exceptions import ConfigError
from ...ranges import txid_range
from . import actions
from .actions import AirflowApi
from .app import (
    Bearer,
    User,
    _topology_of,
    airflow_as,
    base,
    confirmed,
    credential,
    may_trigger,
    readable,
    shown,
    store,
)
from .pages import dag_path, e, page, run_path, table, when
from .previews import confirm_form

router = APIRouter()


def correction_plan(user: Any, dag_id: str, txids: str) -> dict[str, Any]:
    """What a correction of ``txids`` (``A..B``) of the DAG's topology would do (no Spark run)."""
    readable(user, dag_id)
    try:
        first, last = txid_range(txids)
    except ConfigError as exc:
        raise HTTPException(422, str(exc)) from None
    with store() as coordinator:
        tid = _topology_of(coordinator, dag_id)
        if tid is None:
            raise HTTPException(404, f"DAG {dag_id} is not a transactional topology")
        return {"dag_id": dag_id, **coordinator.correction_summary(tid, first, last)}


def trigger(api: AirflowApi, plan: dict[str, Any]) -> str:
    """Trigger the correction run the preview showed; its run id."""
    first, last = plan["txids"]
    run_id = f"correct__{first}-{last}__{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%f')}"
    body = {"dag_run_id": run_id, "logical_date": None, "conf": {"correct": f"{first}..{last}"},
            "note": f"correction of txids {first}..{last} (Transactions view)"}
    return str(api.call("POST", f"/dags/{quote(plan['dag_id'], safe='')}/dagRuns", body)["dag_run_id"])


def render(here: str, plan: dict[str, Any], token: str | None) -> str:
    """The correction's preview page, and the button that triggers it (none when it is refused)."""
    first, last = plan["txids"]
    span = f"{first}..{last}"
    back = f"<p><a href='{e(here)}{dag_path(plan['dag_id'])}'>Back to the topology</a></p>"
    form = (f"<form method=get class=correct action='{e(here)}{dag_path(plan['dag_id'])}/correct'>"
            f"<label>Correct txids <input name=txids value='{e(span)}' size=12></label> "
            "<button type=submit>Preview</button></form>")
    head = f"<h1>Correct txids {e(span)} of {e(plan['topology'])}</h1>{form}"
    if plan["refused"]:
        return page(f"Correct {plan['dag_id']}", f"{head}<p class=blocked>{e(plan['refused'])}</p>{back}")
    inside = (f" (with the corrections inside the range: txids {', '.join(map(str, plan['corrections']))})"
              if plan["corrections"] else "")
    reread = (f"<p>The correction re-reads the {int(plan['records'])} records txids "
              f"{', '.join(map(str, plan['originals']))} read, processes them with the code deployed now, and "
              f"commits, per key, the new value less what they applied{inside}: as the next txid, in order, "
              "exactly once.</p>")
    applied = table(["state", "keys they changed", "total they applied"],
                    [[e(n), str(s["keys"]), e(str(s["total"]))] for n, s in plan["states"].items()], numeric=(1, 2))
    outputs = (f"<p>Its commit also appends compensating events to outputs {e(', '.join(plan['outputs']))}: a "
               "retraction of each event they appended that the fixed code no longer emits as it was, a new "
               "version of each it emits otherwise.</p>") if plan["outputs"] else ""
    body = (f"{head}{reread}<h2>What txids {e(span)} applied</h2>{applied}{outputs}{_previewed(plan)}"
            + (confirm_form(e(f"{here}{dag_path(plan['dag_id'])}/correct?txids={quote(span)}"), token,
                            f"Trigger the correction of txids {span}") if token else
               "<p class=muted>Triggering the correction takes the permission to trigger this DAG's runs, which "
               "your role does not have.</p>")
            + back)
    return page(f"Correct {plan['dag_id']}", body)


def _previewed(plan: dict[str, Any]) -> str:
    """The last preview of this range, or how to make one."""
    first, last = plan["txids"]
    found = plan["preview"]
    if not found:
        return ("<h2>What it would change</h2><p class=muted>Not previewed yet. The topology's own job says which keys "
                f"would change, committing nothing: <code>airflow-txn correct {e(plan['topology'])} {first}..{last} "
                f"--dag-file DAG_FILE</code>; its answer shows here.</p>")
    rows = [[e(n), str(s["changed"]), e(f"{s['old_total']} -> {s['new_total']}"),
             e("; ".join(f"{k}: {o} -> {n_}" for k, o, n_ in s["samples"][:5]))] for n, s in found["states"].items()]
    rows += [[e(f"output {n}"), "-", e(f"{ev['retracted']} retracted, {ev['versions']} new versions, "
                                        f"{ev['new']} new events"), ""] for n, ev in found.get("outputs", {}).items()]
    verdict = ("<p class=blocked>Under the code these txids were committed with, the job gave other deltas: it is "
               "not deterministic, and the correction would be refused at its commit.</p>"
               if found.get("nondeterministic") else "")
    return (f"<h2>What it would change (previewed {when(found['previewed_at'])})</h2>"
            + table(["state or output", "keys changed", "total, or the events appended", "keys that move most"], rows,
                    numeric=(1,)) + verdict
            + "<p class=muted>A preview runs the code deployed when it ran; deploy the fix, then preview again "
              "before correcting.</p>")


def _target(plan: dict[str, Any]) -> str:
    return "{}..{}".format(*plan["txids"])


@router.post("/api/dags/{dag_id}/correct")
def api_correct(request: Request, user: User, bearer: Bearer, dag_id: str, txids: Annotated[str, Body(embed=True)],
                dry_run: Annotated[bool, Body(embed=True)] = True,
                token: Annotated[str | None, Body(embed=True)] = None) -> dict[str, Any]:
    plan = correction_plan(user, dag_id, txids)
    if dry_run or plan["refused"]:
        if not dry_run:
            raise HTTPException(409, plan["refused"])
        return {"dry_run": True, **plan}
    cred = confirmed(request, bearer, "correct", dag_id, _target(plan), token)
    with airflow_as(cred) as api:
        return {"dry_run": False, **plan, "run_id": trigger(api, plan)}


@router.get("/dags/{dag_id}/correct", response_class=HTMLResponse)
def correct_page(request: Request, user: User, bearer: Bearer, dag_id: str, txids: str) -> Response:
    def make() -> str:
        cred = credential(request, bearer)
        plan = correction_plan(user, dag_id, txids)
        token = (actions.form_token(cred, "correct", dag_id, _target(plan))
                 if not plan["refused"] and may_trigger(user, dag_id) else None)
        return render(base(request), plan, token)
    return shown(request, make)


@router.post("/dags/{dag_id}/correct")
def correct_form(request: Request, user: User, bearer: Bearer, dag_id: str, txids: str,
                 token: Annotated[str, Form()] = "") -> Response:
    def make() -> Response:
        plan = correction_plan(user, dag_id, txids)
        if plan["refused"]:
            raise HTTPException(409, plan["refused"])
        cred = confirmed(request, bearer, "correct", dag_id, _target(plan), token)
        with airflow_as(cred) as api:
            run_id = trigger(api, plan)
        return RedirectResponse(f"{base(request)}{run_path(dag_id, run_id)}", 303)
    return shown(request, make)
