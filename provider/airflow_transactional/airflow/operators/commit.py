"""The commit task: waits for its turn in txid order, then commits the run's txid in one
PostgreSQL transaction."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, NoReturn

from airflow.sdk.configuration import conf

from ...coordinator import Coordinator
from ...model import CommitResult, Transaction
from .. import assets
from .base import WaitingTask


class CommitOperator(WaitingTask):
    """Commit this run's txid once txid-1 has committed; a no-op when already committed.

    Waits for its predecessor in PostgreSQL (not with ``depends_on_past``): polling in the worker
    every ``poll_interval`` seconds, then, after ``defer_after``, in the triggerer with
    ``deferrable=True`` (the default; it wakes when txid-1 commits). When an earlier txid failed for good (and stays so
    for ``blocked_grace``), fails with "blocked by failed txid N" so the run frees its
    ``max_active_runs`` slot, and marks its own txid failed so the cascade reaches later runs.
    A deferred commit is committed by its trigger the moment txid-1 commits; the task resumes
    to find it committed and sends its asset events and metrics.
    """

    ui_color = "#e0ecfd"
    writes_outputs = True

    default_wait_timeout = timedelta(hours=1)
    default_poll_interval = 1.0
    commits_in_triggerer = True
    #: Seconds this try's trigger took to commit the txid (None: the trigger did not commit it).
    _committed_took: float | None = None

    def fail_blocked(self, context: Any, reason: str, coordinator: Coordinator | None = None) -> NoReturn:
        """Mark this run's txid failed too, so the cascade reaches later runs, then fail."""
        own = coordinator or self.coordinator()
        try:
            txn = self.run_transaction(own, context)
            own.mark_failed(self.topology_id, txn.txid, reason)
        finally:
            if coordinator is None:
                own.close()
        super().fail_blocked(context, reason, coordinator)

    def resume(self, context: Any, event: dict[str, Any], deadline: float) -> dict[str, Any]:
        if event.get("status") == "committed" and event.get("committed"):  # this try's trigger committed it
            self._committed_took = float(event.get("took") or 0.0)
        return super().resume(context, event, deadline)

    def take_turn(self, context: Any, *, deadline: float, fresh: bool, may_wait: bool = True) -> dict[str, Any]:
        with self.coordinator() as coordinator:
            txn = self.run_transaction(coordinator, context)
            if fresh and not txn.committed:
                coordinator.lift_failed(self.topology_id, txn.txid)  # a cleared commit: its txid is live again
            result, took = self.wait_turn(coordinator, context, lambda: self._commit(coordinator, context, txn),
                                          deadline=deadline, may_wait=may_wait)
            self._tell(coordinator, context, result, took)
            if result.committed:
                self.keep_history(coordinator, result.txid)
        by_trigger = " (committed in the triggerer, as its turn came)" if self._committed_took is not None else ""
        self.log.info("%s%s", result.message, by_trigger)
        return {"txid": result.txid, "committed": result.committed, "attempt": result.attempt,
                "committed_at": result.committed_at.isoformat() if result.committed_at else None}

    def keep_history(self, coordinator: Coordinator, txid: int) -> None:
        """The delta history's retention (``[transactional] delta_history_txids``, 0: keep every
        txid): every tenth of that many commits, the older txids are folded into the snapshot."""
        keep = conf.getint("transactional", "delta_history_txids", fallback=0)
        if keep > 0 and txid % max(1, keep // 10) == 0:
            upto = coordinator.compact_history(self.topology_id, keep)
            if upto is not None:
                self.log.info("delta history of %s: txids through %d folded into its snapshot (keeping %d)",
                              self.topology_id, upto, keep)

    def _commit(self, coordinator: Coordinator, context: Any, txn: Transaction) -> tuple[CommitResult, float]:
        """The commit's result, and how long its Postgres transaction took (seconds)."""
        with self.failing_for_good(coordinator, context, "commit"):
            began = time.monotonic()
            result = coordinator.commit(self.topology_id, txn.txid)
            return result, time.monotonic() - began

    def _tell(self, coordinator: Coordinator, context: Any, result: CommitResult, took: float) -> None:
        """Tell the platform about a commit: the asset events of the state tables (partition key:
        the txid) and of the output logs, and the metrics.

        Only the run that committed the txid tells: the try that committed, its trigger, this
        run's plan task (an empty batch), or a retry when a try died before Airflow recorded its
        success (so its events were never sent) -- the txid committed after this run (re)started.
        The metrics come from whichever committed it, once -- or from such a retry (twice only if the
        try that committed sent them and then died before Airflow recorded it). A clear or backfill of
        a run committed before that sends no asset event: its outlets are dropped for this try.
        """
        started = getattr(context.get("dag_run"), "start_date", None)
        ours = result.committed or (result.committed_at is not None and started is not None
                                    and result.committed_at >= started)
        if not ours:
            self.outlets = []  # Airflow sends an event per outlet of a successful task
            return
        [commit] = coordinator.commits(self.topology_id, result.txid)  # the txid is committed: its entry
        extra = assets.event_extra(self.topology_id, commit)
        self.outlets = assets.committed_outlets(self.outlets, coordinator.spec(self.topology_id))
        for outlet in self.outlets:
            event = context["outlet_events"][outlet]
            event.extra = extra
            if assets.by_txid(outlet):
                event.add_partitions(str(result.txid))
        # Metrics: once, from the try that committed -- or from a retry of a try whose trigger committed
        # the txid but that never resumed (Airflow can fail a deferred try whose trigger fired before
        # its executor reported the deferral: the event is lost, the retry finds the txid committed).
        retried = int(getattr(context.get("ti"), "try_number", 1) or 1) > 1
        if result.committed or self._committed_took is not None or retried:
            self.report_commit(coordinator, result.txid, took if self._committed_took is None else self._committed_took,
                               commit)
