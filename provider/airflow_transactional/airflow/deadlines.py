"""A topology's commit-latency deadline, on Airflow's deadline alerts: when a run has not
committed its txid within ``commit_deadline`` of being queued (the topology's ``stall_after`` is a
good value), Airflow calls back -- in the triggerer -- and the default callback here says so
in the triggerer's log with what the topology's status names as its blocker (a failed txid, or the
stall: what the next txid waits for), and sends the metrics ``transactional.<topology>.late_commits``
and, when stalled, ``stalled`` (see :mod:`airflow_transactional.airflow.metrics`).

``transactional_dag(..., commit_deadline=timedelta(minutes=10), on_late_commit=my_callback)``
swaps in your own coroutine (``async def my_callback(*, topology_id, context)``, importable where
the triggerer runs): page someone, post to a channel. ``context["dag_run"]`` is the run, as
Airflow's REST API shows it.
"""

from __future__ import annotations

import logging
from typing import Any

from . import metrics
from .hooks import TransactionalHook
from .triggers import blocking

log = logging.getLogger(__name__)


async def late_commit(*, topology_id: str, context: dict[str, Any], conn_id: str = "transactional_default") -> None:
    """The default callback of a missed commit deadline."""
    run = context.get("dag_run") or {}
    deadline = (context.get("deadline") or {}).get("deadline_time")
    stalled, why = await blocking(blocker, topology_id, conn_id)
    log.warning("topology %s: run %s (queued at %s) has not committed by its deadline %s: %s", topology_id,
                run.get("dag_run_id"), run.get("queued_at"), deadline,
                why or "see the topology's Transactions page for what it waits for")
    metrics.late(topology_id, stalled=stalled)


def blocker(topology_id: str, conn_id: str) -> tuple[bool, str | None]:
    """(stalled, what blocks it) as the topology's status says; (False, None) when the store cannot
    be asked (a deadline's warning is sent all the same)."""
    try:
        with TransactionalHook(conn_id).coordinator() as coordinator:
            status = coordinator.status(topology_id)
    except Exception as exc:  # the store is out of reach, the connection missing: still warn
        log.warning("topology %s: its status could not be read for the deadline's warning (%s)", topology_id,
                    type(exc).__name__)
        return False, None
    return status.stalled, status.blocked_by
