"""What the three tasks share: the topology's stored declaration, the run's transaction, and
how a waiting task finds out that the txid it waits for will never commit (docs/design.md, trap 2)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from ..coordinator import Coordinator, Transaction
from ..exceptions import WaitingForPredecessor
from ..hooks import TransactionalHook

#: What :meth:`TopologyTask.airflow_run_state` says of a run Airflow no longer has.
DELETED = "deleted"


def _not_found(exc: Exception) -> bool:
    """Whether a Task SDK call failed because the api-server has no such object (HTTP 404)."""
    detail = getattr(getattr(exc, "error", None), "detail", None)
    return isinstance(detail, dict) and detail.get("status_code") == 404


class TopologyTask(BaseOperator):
    """Shared parts: the topology's stored declaration and the run's transaction."""

    ui_color = "#e8f4ea"
    #: How often a waiting task asks Airflow about the run of the txid it waits for (seconds).
    airflow_check_interval = 5.0

    def __init__(self, *, topology: Mapping[str, Any], transactional_conn_id: str = "transactional_default",
                 blocked_grace: timedelta = timedelta(seconds=30), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.topology = dict(topology)
        self.transactional_conn_id = transactional_conn_id
        self.blocked_grace = blocked_grace
        self._airflow_checked_at: float | None = None
        self._airflow_verdict: str | None = None
        self._airflow_state: str | None = None

    @property
    def topology_id(self) -> str:
        return str(self.topology["topology_id"])

    def coordinator(self) -> Coordinator:
        return TransactionalHook(self.transactional_conn_id).get_coordinator()

    def run_transaction(self, coordinator: Coordinator, context: Mapping[str, Any]) -> Transaction:
        txn = coordinator.transaction_for_run(self.topology_id, context["run_id"])
        if txn is None:
            raise AirflowFailException(f"run {context['run_id']} has no transaction of topology "
                                       f"{self.topology_id!r}: clear its plan task first")
        return txn

    def still_blocked(self, coordinator: Coordinator, txid: int, since: list[float],
                      context: Mapping[str, Any]) -> str | None:
        """The blocker of ``txid`` once it has held for ``blocked_grace`` (else None).

        A blocker is an earlier txid that failed for good (recorded in Postgres), or one whose
        Airflow run will not commit it (:meth:`stalled_predecessor`); a deleted run outranks the
        record, whose advice (clear that run) no longer applies. The grace covers a cleared or
        backfilled predecessor whose tasks have not started yet (starting lifts the failed mark);
        ``since`` carries the first sighting across polls.
        """
        recorded = coordinator.blocker(self.topology_id, txid)
        stalled = self.stalled_predecessor(coordinator, txid, context)
        blocked = stalled if stalled and self._airflow_state == DELETED else (recorded or stalled)
        if blocked is None:
            since.clear()
            return None
        if not since:
            since.append(time.monotonic())
            self.log.warning("%s -- failing in %.0fs unless it is retried", blocked, self.blocked_grace.total_seconds())
        return blocked if time.monotonic() - since[0] >= self.blocked_grace.total_seconds() else None

    def airflow_run_state(self, context: Mapping[str, Any], run_id: str) -> str | None:
        """Airflow's state of this DAG's run ``run_id``; :data:`DELETED` when Airflow has no such
        run, None when it cannot say (no task instance at hand, the API away for a moment)."""
        ti = context.get("ti")
        if ti is None:
            return None
        try:
            state = ti.get_dagrun_state(dag_id=ti.dag_id, run_id=run_id)
        except Exception as exc:
            if _not_found(exc):
                return DELETED
            self.log.debug("no Airflow state for run %s: %s", run_id, exc)
            return None
        return str(getattr(state, "value", state))

    def stalled_predecessor(self, coordinator: Coordinator, txid: int, context: Mapping[str, Any]) -> str | None:
        """Why the txid that ``txid`` waits for will not commit, by Airflow's view of its run (or None).

        A task that fails for good says so in Postgres; one killed on its last try (SIGKILL, the
        OOM killer, a lost worker) says nothing, and the runs waiting for it would hold their
        ``max_active_runs`` slots until the cleared run could never start (docs/design.md, trap 2).
        Airflow knows better: that run is failed. A run that is not running at all cannot commit
        either: queued behind the slots its waiters hold, finished without committing (marked
        success by hand), or deleted (the next run of the DAG takes its batch over, see
        :meth:`PlanOperator.adopt_orphan`). A failed, finished or deleted run is also recorded as
        failed in Postgres, so ``airflow-txn status`` names it. Asked at most every
        ``airflow_check_interval`` seconds.
        """
        now = time.monotonic()
        if self._airflow_checked_at is not None and now - self._airflow_checked_at < self.airflow_check_interval:
            return self._airflow_verdict
        self._airflow_checked_at, self._airflow_verdict, self._airflow_state = now, None, None
        pending = coordinator.first_pending(self.topology_id, txid)
        if pending is None:
            return None
        pred, run_id = pending
        state = self._airflow_state = self.airflow_run_state(context, run_id)
        if state in (None, "running"):
            return None
        why = {"failed": "its Airflow run failed without recording why (a task killed on its last try: "
                         "SIGKILL, out of memory, a lost worker?)",
               "success": f"its Airflow run finished without committing txid {pred} (marked success by hand?)",
               "queued": "its Airflow run is queued and cannot start while the runs waiting for it hold the "
                         "DAG's max_active_runs slots",
               DELETED: "its Airflow run was deleted"}.get(state, f"its Airflow run is {state}")
        if state in ("failed", "success", DELETED):
            coordinator.mark_failed(self.topology_id, pred, why)
        fix = ("The next run of this DAG takes its batch over: trigger one (or let the schedule start it)"
               if state == DELETED else "Clear that run's tasks or backfill it with 'reprocess failed'")
        self._airflow_verdict = f"blocked by txid {pred} (run {run_id}): {why}. {fix}; this run can then be cleared too"
        return self._airflow_verdict

    @contextmanager
    def failing_for_good(self, coordinator: Coordinator, context: Mapping[str, Any], what: str) -> Iterator[None]:
        """On the last try, record a failure so later commits fail fast instead of waiting (trap 2)."""
        try:
            yield
        except WaitingForPredecessor:  # not a failure: the commit polls until its turn
            raise
        except Exception as exc:
            if int(context["ti"].try_number) > int(self.retries or 0):
                txn = coordinator.transaction_for_run(self.topology_id, context["run_id"])
                if txn is not None and not txn.committed:
                    coordinator.mark_failed(self.topology_id, txn.txid, f"{self.task_id}: {what} failed: {exc}")
            raise


