"""The commit task: waits for its turn in txid order, then commits the run's txid in one
PostgreSQL transaction."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from ..coordinator import CommitResult, Coordinator, Transaction
from ..exceptions import WaitingForPredecessor
from ..triggers import COMMIT
from .base import WaitingTask


class CommitOperator(WaitingTask):
    """Commit this run's txid once txid-1 has committed; a no-op when already committed.

    Waits for its predecessor in PostgreSQL (not with ``depends_on_past``): polling in the worker
    every ``poll_interval`` seconds, then, after ``defer_after``, in the triggerer with
    ``deferrable=True`` (the default; it wakes when txid-1 commits). When an earlier txid failed for good (and stays so
    for ``blocked_grace``), fails with "blocked by failed txid N" so the run frees its
    ``max_active_runs`` slot, and marks its own txid failed so the cascade reaches later runs.
    """

    ui_color = "#e0ecfd"

    def __init__(self, *, wait_timeout: timedelta = timedelta(hours=1), poll_interval: float = 1.0,
                 **kwargs: Any) -> None:
        super().__init__(wait_timeout=wait_timeout, poll_interval=poll_interval, **kwargs)

    def execute(self, context: Any) -> dict[str, Any]:
        return self._commit(context, deadline=self.deadline(), fresh=True)

    def resume(self, context: Any, event: dict[str, Any], deadline: float) -> dict[str, Any]:
        """Back from the triggerer: commit if it is our turn, fail if never, else wait on."""
        if event.get("status") == "blocked":
            coordinator = self.coordinator()
            try:
                txn = self.run_transaction(coordinator, context)
                coordinator.mark_failed(self.topology_id, txn.txid, event["reason"])
            finally:
                coordinator.close()
            raise AirflowFailException(event["reason"])
        return self._commit(context, deadline=deadline, fresh=False, may_wait=event.get("status") != "timeout")

    def _commit(self, context: Any, *, deadline: float, fresh: bool, may_wait: bool = True) -> dict[str, Any]:
        coordinator = self.coordinator()
        try:
            txn = self.run_transaction(coordinator, context)
            if fresh and not txn.committed:
                coordinator.retrying(self.topology_id, txn.txid)  # a cleared commit: its txid is live again
            result = self._wait_and_commit(coordinator, context, txn, deadline, may_wait)
        finally:
            coordinator.close()
        self.log.info("%s", result.message)
        return {"txid": result.txid, "committed": result.committed, "attempt": result.attempt,
                "committed_at": result.committed_at.isoformat() if result.committed_at else None}

    def _wait_and_commit(self, coordinator: Coordinator, context: Any, txn: Transaction, deadline: float,
                         may_wait: bool) -> CommitResult:
        watch = self.watch(context)
        announced = False
        since = time.monotonic()
        while True:
            try:
                with self.failing_for_good(coordinator, context, "commit"):
                    return coordinator.commit(self.topology_id, txn.txid)
            except WaitingForPredecessor as exc:
                if not may_wait or time.time() > deadline:
                    raise
                if not announced:
                    self.log.info("%s", exc)
                    announced = True
                if self.time_to_defer(since):
                    self.wait_in_triggerer(context, deadline=deadline, waiting_for=COMMIT, txid=txn.txid)
                blocked = watch.still_blocked(coordinator, txn.txid)
                if blocked:
                    coordinator.mark_failed(self.topology_id, txn.txid, blocked)
                    raise AirflowFailException(blocked) from exc
                time.sleep(self.poll_interval)
