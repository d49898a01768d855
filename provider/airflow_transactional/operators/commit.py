"""The commit task: waits for its turn in txid order, then commits the run's txid in one
PostgreSQL transaction."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from ..exceptions import WaitingForPredecessor
from .base import TopologyTask


class CommitOperator(TopologyTask):
    """Commit this run's txid once txid-1 has committed; a no-op when already committed.

    Waits for its predecessor in PostgreSQL (not with ``depends_on_past``). When an earlier
    txid failed for good (and stays so for ``blocked_grace``), fails with "blocked by failed
    txid N" so the run frees its ``max_active_runs`` slot, and marks its own txid failed so the
    cascade reaches later runs.
    """

    ui_color = "#e0ecfd"

    def __init__(self, *, wait_timeout: timedelta = timedelta(hours=1), poll_interval: float = 1.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.wait_timeout = wait_timeout
        self.poll_interval = poll_interval

    def execute(self, context: Any) -> dict[str, Any]:
        coordinator = self.coordinator()
        try:
            txn = self.run_transaction(coordinator, context)
            if not txn.committed:
                coordinator.retrying(self.topology_id, txn.txid)  # a cleared commit: its txid is live again
            deadline = time.monotonic() + self.wait_timeout.total_seconds()
            announced = False
            since: list[float] = []
            while True:
                try:
                    with self.failing_for_good(coordinator, context, "commit"):
                        result = coordinator.commit(self.topology_id, txn.txid)
                    break
                except WaitingForPredecessor as exc:
                    blocked = self.still_blocked(coordinator, txn.txid, since, context)
                    if blocked:
                        coordinator.mark_failed(self.topology_id, txn.txid, blocked)
                        raise AirflowFailException(blocked) from exc
                    if time.monotonic() > deadline:
                        raise
                    if not announced:
                        self.log.info("%s", exc)
                        announced = True
                    time.sleep(self.poll_interval)
        finally:
            coordinator.close()
        self.log.info("%s", result.message)
        return {"txid": result.txid, "committed": result.committed, "attempt": result.attempt,
                "committed_at": result.committed_at.isoformat() if result.committed_at else None}

