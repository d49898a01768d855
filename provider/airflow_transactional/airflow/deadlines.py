"""A topology's commit-latency deadline, on Airflow's deadline alerts: when a run has not
committed its txid within ``commit_deadline`` of being queued, Airflow calls back -- in the
triggerer -- and the default callback here says so in the triggerer's log and sends the metric
``transactional.<topology>.late_commits`` (see :mod:`airflow_transactional.metrics`).

``transactional_dag(..., commit_deadline=timedelta(minutes=10), on_late_commit=my_callback)``
swaps in your own coroutine (``async def my_callback(*, topology_id, context)``, importable where
the triggerer runs): page someone, post to a channel. ``context["dag_run"]`` is the run, as
Airflow's REST API shows it.
"""

from __future__ import annotations

import logging
from typing import Any

from . import metrics

log = logging.getLogger(__name__)


async def late_commit(*, topology_id: str, context: dict[str, Any]) -> None:
    """The default callback of a missed commit deadline."""
    run = context.get("dag_run") or {}
    deadline = (context.get("deadline") or {}).get("deadline_time")
    log.warning("topology %s: run %s (queued at %s) has not committed by its deadline %s: see the topology's "
                "Transactions page for what it waits for", topology_id, run.get("dag_run_id"), run.get("queued_at"),
                deadline)
    metrics.late(topology_id)
