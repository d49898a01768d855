"""The plan task: gives the run its txid and fixes its batch (or takes over the batch of a run
that was deleted)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from ..coordinator import Coordinator, Transaction
from ..exceptions import TooManyInFlight
from ..spec import TopologySpec
from .base import DELETED, TopologyTask


class PlanOperator(TopologyTask):
    """Give this run its txid and fix its batch (idempotent: a replay gets the stored plan).

    Registers the topology first (creates/migrates tables; idempotent). When ``max_in_flight``
    txids are uncommitted it waits up to ``wait_timeout`` for one to commit -- unless an earlier
    txid failed for good, which no waiting can fix: then it fails (after ``blocked_grace``) and
    says which.
    """

    def __init__(self, *, wait_timeout: timedelta = timedelta(minutes=30), poll_interval: float = 2.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.wait_timeout = wait_timeout
        self.poll_interval = poll_interval
        self._orphans_checked_at: float | None = None

    def execute(self, context: Any) -> dict[str, Any]:
        spec = TopologySpec.from_config(self.topology)
        coordinator = self.coordinator()
        try:
            coordinator.register(spec)
            deadline = time.monotonic() + self.wait_timeout.total_seconds()
            since: list[float] = []
            waiting_for: list[int] | None = None
            while True:
                try:
                    txn = self.adopt_orphan(coordinator, context) or coordinator.plan(self.topology_id,
                                                                                      context["run_id"])
                    break
                except TooManyInFlight as exc:
                    blocked = self.still_blocked(coordinator, max(exc.in_flight) + 1, since, context)
                    if blocked:
                        raise AirflowFailException(blocked) from exc
                    if time.monotonic() > deadline:
                        raise
                    if exc.in_flight != waiting_for:  # say it once per change, not every poll
                        waiting_for = exc.in_flight
                        self.log.info("%s; waiting", exc)
                    time.sleep(self.poll_interval)
        finally:
            coordinator.close()
        state = "committed" if txn.committed else "planned"
        self.log.info("run %s is txid %d of topology %s (%s, %d records, offsets %s -> %s)",
                      context["run_id"], txn.txid, self.topology_id, state, txn.planned_records,
                      txn.start_offsets, txn.end_offsets)
        return {"txid": txn.txid, "records": txn.planned_records, "status": txn.status}

    def adopt_orphan(self, coordinator: Coordinator, context: Mapping[str, Any]) -> Transaction | None:
        """The batch of an uncommitted txid whose Airflow run was deleted, handed to this run.

        That txid keeps its place in the order and every later commit waits for it, so with no
        run left to commit it the topology would stop for good. The next new run of the DAG
        (triggered, scheduled or backfilled) takes it over -- plan, staged output and all --
        before planning a batch of its own. Only on Airflow's word that the run does not exist
        (HTTP 404), never on silence. Asked at most every ``airflow_check_interval`` seconds.
        """
        now = time.monotonic()
        if self._orphans_checked_at is not None and now - self._orphans_checked_at < self.airflow_check_interval:
            return None
        self._orphans_checked_at = now
        run_id = context["run_id"]
        if coordinator.transaction_for_run(self.topology_id, run_id) is not None:
            return None  # this run has its txid already (a retry, a clear)
        for txid, old_run in coordinator.planned_runs(self.topology_id):
            if self.airflow_run_state(context, old_run) != DELETED:
                continue
            txn = coordinator.adopt(self.topology_id, txid, old_run, run_id)
            if txn is not None:
                self.log.warning("txid %d's Airflow run %s was deleted: run %s takes its batch over",
                                 txid, old_run, run_id)
                return txn
        return None


