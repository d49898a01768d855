"""The actions of the Transactions pages -- clear a failed run, reprocess the failed runs of a
blocked range -- done through Airflow's own REST API with the signed-in user's credential, so
Airflow's permissions, audit log and semantics apply exactly as if the user had used the grid or
the backfill dialog. Each has a preview first: Airflow's own dry run of the same request, joined
with what the state store knows of each run (its txid, its status, what reprocessing it means).

Exactly-once does not depend on any of this: clearing or backfilling a run of a transactional
DAG is always safe (a committed txid is a logged no-op, a failed one processes its planned batch
again and commits in txid order). The preview says what will happen so nobody has to guess.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from ...coordinator import Coordinator
from ...exceptions import ActionRefused

#: The most failed runs a reprocess preview looks at (Airflow pages its run list at 100).
MAX_RUNS = 1000


def api_url() -> str:
    """Where this api-server's own REST API answers: ``[transactional] api_url`` if set, else
    the api-server's host and port (``[api] host``/``port``) under the path of ``[api] base_url``.
    A loopback call, so a proxy in front of the api-server does not matter."""
    from airflow.configuration import conf

    explicit = conf.get("transactional", "api_url", fallback="")
    if explicit:
        return explicit.rstrip("/")
    host = conf.get("api", "host", fallback="127.0.0.1")
    if host in ("", "0.0.0.0", "::"):  # a bind-all address: reached on loopback
        host = "127.0.0.1"
    scheme = "https" if conf.get("api", "ssl_cert", fallback="") else "http"
    path = urlsplit(conf.get("api", "base_url", fallback="") or "/").path.rstrip("/")
    return f"{scheme}://{host}:{conf.getint('api', 'port', fallback=8080)}{path}"


def form_token(credential: str, action: str, dag_id: str, target: str) -> str:
    """The hidden field an action's form must send back: bound to the user's credential (which
    a page of another site cannot read), so a forged form post is refused."""
    msg = f"{action}\0{dag_id}\0{target}".encode()
    return hmac.new(credential.encode(), msg, hashlib.sha256).hexdigest()


def form_token_ok(credential: str, action: str, dag_id: str, target: str, token: str | None) -> bool:
    return bool(token) and hmac.compare_digest(form_token(credential, action, dag_id, target), token or "")


class AirflowApi:
    """Airflow's REST API (``/api/v2``) as the user whose credential this holds."""

    def __init__(self, credential: str, base: str | None = None, timeout: float = 60) -> None:
        base = base or api_url()
        # The api-server's own certificate names its public host, not the loopback address this
        # reaches it on: only there is it not verified. Anywhere else the credential goes only
        # to a verified server.
        loopback = urlsplit(base).hostname in ("127.0.0.1", "localhost", "::1")
        self._client = httpx.Client(base_url=base + "/api/v2", timeout=timeout, verify=not loopback,
                                    headers={"Authorization": f"Bearer {credential}"})

    def __enter__(self) -> AirflowApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        try:
            resp = self._client.request(method, path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise ActionRefused(502, f"Airflow's API at {self._client.base_url} did not answer ({exc}): "
                                     "set [transactional] api_url to where this api-server can reach itself") from None
        if resp.status_code >= 400:
            raise ActionRefused(resp.status_code, _detail(resp))
        return resp.json() if resp.content else None

    def failed_runs(self, dag_id: str) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = []
        while len(runs) < MAX_RUNS:
            body = self.call("GET", f"/dags/{quote(dag_id, safe='')}/dagRuns", params={
                "state": "failed", "order_by": "logical_date", "limit": 100, "offset": len(runs)})
            runs += body["dag_runs"]
            if not body["dag_runs"] or len(runs) >= body["total_entries"]:
                break
        return runs


def _detail(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail", resp.text)
    except ValueError:
        detail = resp.text
    if resp.status_code == 403:
        return "Airflow says you may not do this (403 Forbidden): ask for a role that may edit this DAG's runs"
    return detail if isinstance(detail, str) else str(detail)


# -- clear a run ------------------------------------------------------------------------------

@dataclass
class ClearPlan:
    """What clearing one run's failed tasks will do."""

    dag_id: str
    run_id: str
    txid: int | None
    status: str | None
    tasks: list[dict[str, Any]]  # the task instances Airflow would clear: task_id, state
    effect: str                  # what happens to the transaction, in words
    blocked_after: list[int] = field(default_factory=list)  # later txids that stay failed


def _clear_body(run_id: str, dry_run: bool, note: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"dry_run": dry_run, "dag_run_id": run_id, "only_failed": True, "reset_dag_runs": True}
    if note:
        body["note"] = note
    return body


def plan_clear(api: AirflowApi, coordinator: Coordinator, topology_id: str, dag_id: str, run_id: str) -> ClearPlan:
    """Airflow's dry run of clearing the run's failed tasks, and what it means for its txid."""
    answer = api.call("POST", f"/dags/{quote(dag_id, safe='')}/clearTaskInstances", _clear_body(run_id, True))
    tasks = [{"task_id": t["task_id"], "state": t.get("state")} for t in answer["task_instances"]]
    txn = coordinator.transaction_for_run(topology_id, run_id)
    failed_later = []
    if txn is not None and not txn.committed:
        for r in api.failed_runs(dag_id):
            later = coordinator.transaction_for_run(topology_id, r["dag_run_id"])
            if later is not None and not later.committed and later.txid > txn.txid:
                failed_later.append(later.txid)
    if not tasks:
        effect = "Nothing to clear: no task of this run failed."
    elif txn is None:
        effect = ("This run has no txid yet: its plan task runs again and takes the next batch of the source "
                  "when fewer than max_in_flight transactions are uncommitted.")
    elif txn.committed:
        effect = f"txid {txn.txid} is already committed: clearing it changes nothing (a logged no-op)."
    else:
        committed = coordinator.status(topology_id).committed_txid
        effect = (f"txid {txn.txid} processes the same batch again ({txn.planned_records:,} records) -- "
                  "or reuses its staged output if a complete attempt is kept -- and commits right after txid "
                  f"{txn.txid - 1}" + (" (committed)." if txn.txid - 1 <= committed else "."))
    return ClearPlan(dag_id, run_id, txn.txid if txn else None, txn.status if txn else None, tasks, effect,
                     sorted(failed_later))


def clear(api: AirflowApi, dag_id: str, run_id: str, txid: int | None) -> int:
    """Clear the run's failed tasks (Airflow's "Clear" with "only failed"); how many were cleared."""
    note = f"Cleared from Transactions: txid {txid} processes its batch again" if txid else None
    answer = api.call("POST", f"/dags/{quote(dag_id, safe='')}/clearTaskInstances", _clear_body(run_id, False, note))
    return len(answer["task_instances"])


# -- reprocess the failed runs of a blocked range ----------------------------------------------

@dataclass
class ReprocessPlan:
    """A backfill with "reprocess failed" over the logical dates of the topology's failed runs."""

    dag_id: str
    from_date: str | None
    to_date: str | None
    max_active_runs: int
    runs: list[dict[str, Any]]  # per logical date Airflow would run: logical_date, run_id, txid, what happens
    unreachable: list[str]      # failed runs a backfill cannot reach (no logical date, or off the schedule)
    problem: str | None = None  # why there is nothing to reprocess, or why Airflow cannot


def _reprocess_body(plan: ReprocessPlan) -> dict[str, Any]:
    return {"dag_id": plan.dag_id, "from_date": plan.from_date, "to_date": plan.to_date,
            "reprocess_behavior": "failed", "max_active_runs": plan.max_active_runs}


def plan_reprocess(api: AirflowApi, coordinator: Coordinator, topology_id: str, dag_id: str) -> ReprocessPlan:
    """The range from the oldest uncommitted failed run to the newest failed run, and Airflow's
    dry run of a "reprocess failed" backfill over it."""
    spec = coordinator.spec(topology_id)
    committed = coordinator.status(topology_id).committed_txid
    txid_of: dict[str, tuple[int, str]] = {}
    pending = []
    for r in api.failed_runs(dag_id):
        txn = coordinator.transaction_for_run(topology_id, r["dag_run_id"])
        if txn is not None:
            txid_of[r["dag_run_id"]] = (txn.txid, txn.status)
            if txn.committed or txn.txid <= committed:
                continue  # committed: nothing to reprocess
        pending.append(r)
    dated = [r for r in pending if r.get("logical_date")]
    plan = ReprocessPlan(dag_id, None, None, spec.max_in_flight, [],
                         [r["dag_run_id"] for r in pending if not r.get("logical_date")])
    if not dated:
        plan.problem = ("No failed run with a logical date is waiting to commit: nothing for a backfill to reprocess."
                        + (" Clear the runs listed below instead." if plan.unreachable else ""))
        return plan
    stamps = sorted(datetime.fromisoformat(r["logical_date"]) for r in dated)
    plan.from_date, plan.to_date = stamps[0].isoformat(), stamps[-1].isoformat()
    try:
        answer = api.call("POST", "/backfills/dry_run", _reprocess_body(plan))
    except ActionRefused as exc:
        if exc.status in (401, 403):
            raise
        plan.problem = f"Airflow cannot backfill this DAG ({exc.detail}): clear each failed run instead."
        return plan
    by_date = {datetime.fromisoformat(r["logical_date"]): r for r in pending if r.get("logical_date")}
    for b in answer["backfills"]:
        stamp = datetime.fromisoformat(b["logical_date"]) if b.get("logical_date") else None
        run = by_date.get(stamp) if stamp else None
        if run is None:
            plan.runs.append({"logical_date": b["logical_date"], "run_id": None, "txid": None,
                              "effect": "a new run: it takes the next batch of the source"})
            continue
        txid, status = txid_of.get(run["dag_run_id"], (None, None))
        effect = ("cleared in place: plans the next batch of the source" if txid is None else
                  f"cleared in place: txid {txid} ({status}) processes its batch again, or reuses its staged "
                  "output, and commits in txid order")
        plan.runs.append({"logical_date": b["logical_date"], "run_id": run["dag_run_id"], "txid": txid,
                          "effect": effect})
    reached = {r["run_id"] for r in plan.runs}
    plan.unreachable += [r["dag_run_id"] for r in dated if r["dag_run_id"] not in reached]
    if not plan.runs:
        plan.problem = "Airflow would run nothing over this range."
    return plan


def reprocess(api: AirflowApi, plan: ReprocessPlan) -> dict[str, Any]:
    """Create the backfill the preview showed; Airflow's answer (its id among others)."""
    return dict(api.call("POST", "/backfills", _reprocess_body(plan)))
