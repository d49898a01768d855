"""The plan task: gives the run its txid and fixes its batch (or takes over the batch of a run
that was deleted)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from .. import metrics
from ..coordinator import Coordinator, Transaction
from ..exceptions import TooManyInFlight
from ..spec import TopologySpec
from ..triggers import SLOT
from ..watch import Watch
from .base import WaitingTask


class PlanOperator(WaitingTask):
    """Give this run its txid and fix its batch (idempotent: a replay gets the stored plan).

    Registers the topology first (creates/migrates tables; idempotent). When ``max_in_flight``
    txids are uncommitted it waits up to ``wait_timeout`` for one to commit (after
    ``defer_after``, in the triggerer with ``deferrable=True``, the default) -- unless an earlier
    txid failed for good, which no waiting can fix: then it fails (after ``blocked_grace``) and
    says which.
    """

    def __init__(self, *, wait_timeout: timedelta = timedelta(minutes=30), poll_interval: float = 2.0,
                 **kwargs: Any) -> None:
        super().__init__(wait_timeout=wait_timeout, poll_interval=poll_interval, **kwargs)

    def execute(self, context: Any) -> dict[str, Any]:
        return self._plan(context, deadline=self.deadline(), fresh=True)

    def resume(self, context: Any, event: dict[str, Any], deadline: float) -> dict[str, Any]:
        """Back from the triggerer: plan if a slot (or an orphaned batch) is free, fail if never."""
        if event.get("status") == "blocked":
            metrics.blocked(self.topology_id)
            raise AirflowFailException(event["reason"])
        return self._plan(context, deadline=deadline, fresh=False, may_wait=event.get("status") != "timeout")

    def _plan(self, context: Any, *, deadline: float, fresh: bool, may_wait: bool = True) -> dict[str, Any]:
        coordinator = self.coordinator()
        try:
            if fresh:
                coordinator.register(TopologySpec.from_config(self.topology))
            txn = self._wait_and_plan(coordinator, context, deadline, may_wait)
        finally:
            coordinator.close()
        state = "committed" if txn.committed else "planned"
        self.log.info("run %s is txid %d of topology %s (%s, %d records, offsets %s -> %s)",
                      context["run_id"], txn.txid, self.topology_id, state, txn.planned_records,
                      txn.start_offsets, txn.end_offsets)
        return {"txid": txn.txid, "records": txn.planned_records, "status": txn.status}

    def _wait_and_plan(self, coordinator: Coordinator, context: Any, deadline: float, may_wait: bool) -> Transaction:
        watch = self.watch(context)
        waiting_for: list[int] | None = None
        since = time.monotonic()
        while True:
            try:
                return self.adopt_orphan(coordinator, context, watch) or coordinator.plan(self.topology_id,
                                                                                         context["run_id"])
            except TooManyInFlight as exc:
                if not may_wait or time.time() > deadline:
                    raise
                if exc.in_flight != waiting_for:  # say it once per change, not every poll
                    waiting_for = exc.in_flight
                    self.log.info("%s; waiting", exc)
                if self.time_to_defer(since):
                    self.wait_in_triggerer(context, deadline=deadline, waiting_for=SLOT, in_flight=exc.in_flight)
                blocked = watch.still_blocked(coordinator, max(exc.in_flight) + 1)
                if blocked:
                    metrics.blocked(self.topology_id)
                    raise AirflowFailException(blocked) from exc
                time.sleep(self.poll_interval)

    def adopt_orphan(self, coordinator: Coordinator, context: Mapping[str, Any],
                     watch: Watch | None = None) -> Transaction | None:
        """The batch of an uncommitted txid whose Airflow run was deleted, handed to this run.

        That txid keeps its place in the order and every later commit waits for it, so with no
        run left to commit it the topology would stop for good. The next new run of the DAG
        (triggered, scheduled or backfilled) takes it over -- plan, staged output and all --
        before planning a batch of its own. Only on Airflow's word that the run does not exist
        (HTTP 404), never on silence. Asked at most every ``airflow_check_interval`` seconds.
        """
        run_id = context["run_id"]
        if coordinator.transaction_for_run(self.topology_id, run_id) is not None:
            return None  # this run has its txid already (a retry, a clear)
        for txid, old_run in (watch or self.watch(context)).deleted_runs(coordinator.planned_runs(self.topology_id)):
            txn = coordinator.adopt(self.topology_id, txid, old_run, run_id)
            if txn is not None:
                self.log.warning("txid %d's Airflow run %s was deleted: run %s takes its batch over",
                                 txid, old_run, run_id)
                return txn
        return None
