"""What Airflow holds a run's tasks for, in words: read from Airflow's own tables by the plugin,
which runs in the api-server beside them. The store knows a txid is *planned*; only Airflow knows
that its process task waits for a slot of the ``spark`` pool (and how full the pool is), for a
worker, or in the triggerer -- what an operator needs to see when a topology does not move.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from ...model import duration

log = logging.getLogger(__name__)

#: A run's tasks in the order they run: the first unfinished one is what the run waits on.
TASK_ORDER = ("plan", "process", "commit", "publish")
FINISHED = {"success", "skipped", "removed"}


def waiting(dag_id: str, run_ids: Sequence[str], now: datetime,
            may_read_pool: Callable[[str, str | None], bool]) -> dict[str, str]:
    """``{run_id: what it waits for}`` for the runs of ``dag_id`` that wait on Airflow (a slot of
    a pool, a worker, the triggerer, a retry, ``max_active_runs``); runs whose task is running are
    left out (the store says what it does). A pool's use (its running, queued and waiting tasks, of
    every DAG) is told only to whom ``may_read_pool(name, team)``, as Airflow's pool pages are.
    Empty when Airflow's tables cannot be read."""
    if not run_ids:
        return {}
    try:
        tis, runs, pools, teams = _read(dag_id, list(run_ids))
    except Exception as exc:  # the page shows the store's view without Airflow's
        log.warning("what Airflow holds the runs of %s for could not be read: %s", dag_id, exc)
        return {}
    shown = {name for name in pools if may_read_pool(name, teams.get(name))}
    found = {}
    for run_id in run_ids:
        said = describe(tis.get(run_id, {}), runs.get(run_id), pools, now, shown)
        if said:
            found[run_id] = said
    return found


def _read(dag_id: str, run_ids: list[str]
          ) -> tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, Any], dict[str, str | None]]:
    from airflow.models.dagrun import DagRun
    from airflow.models.pool import Pool
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        tis: dict[str, dict[str, Any]] = {}
        for row in session.execute(select(TI.run_id, TI.task_id, TI.state, TI.pool, TI.scheduled_dttm,
                                          TI.queued_dttm, TI.start_date, TI.end_date, TI.try_number)
                                   .where(TI.dag_id == dag_id, TI.run_id.in_(run_ids), TI.map_index == -1)):
            tis.setdefault(row.run_id, {})[row.task_id] = row
        runs = {r.run_id: r for r in session.execute(select(DagRun.run_id, DagRun.state, DagRun.queued_at)
                                                      .where(DagRun.dag_id == dag_id, DagRun.run_id.in_(run_ids)))}
        pools = dict(Pool.slots_stats(session=session))
        teams = {str(name): team for name, team in session.execute(select(Pool.pool, Pool.team_name))}
    return tis, runs, pools, teams


def describe(tis: dict[str, Any], run: Any, pools: dict[str, Any], now: datetime,
             shown: set[str] | None = None) -> str | None:
    """What one run waits for, from its task instances, its row and the pools' use (told for the
    pools in ``shown``; all of them when None)."""
    def lasted(since: datetime | None) -> str:
        return f" for {duration((now - since).total_seconds())}" if since else ""

    if run is not None and _value(run.state) == "queued":
        return f"the run is queued{lasted(run.queued_at)} (the DAG's max_active_runs are all running)"
    ti = next((tis[t] for t in TASK_ORDER if t in tis and _value(tis[t].state) not in FINISHED), None)
    if ti is None:
        return None
    state, task = _value(ti.state), ti.task_id
    if state == "scheduled":
        pool = pools.get(ti.pool)
        if pool is not None and pool["open"] <= 0:
            said = f"{task} waits for a slot of pool {ti.pool}{lasted(ti.scheduled_dttm)}"
            if shown is not None and ti.pool not in shown:
                return said
            total = "unlimited" if pool["total"] == float("inf") else int(pool["total"])
            return (f"{said} ({int(pool['running'])} running, {int(pool['queued'])} queued of {total}; "
                    f"{int(pool['scheduled'])} waiting)")
        return f"{task} is scheduled{lasted(ti.scheduled_dttm)}, not queued yet (the scheduler's limits)"
    if state == "queued":
        return f"{task} is queued{lasted(ti.queued_dttm)}, waiting for a worker to start it"
    if state == "deferred":
        return f"{task} waits in the triggerer for its turn{lasted(ti.start_date)}"
    if state == "up_for_retry":
        ago = f" {duration((now - ti.end_date).total_seconds())} ago" if ti.end_date else ""
        return f"{task} failed try {ti.try_number}{ago}: Airflow retries it after its retry_delay"
    return None


def _value(state: Any) -> str:
    """A state as Airflow stores it (an enum's value, or the text itself)."""
    return str(getattr(state, "value", state))
