"""What the three tasks share: the topology's stored declaration and the run's transaction; and
what the two that may wait for their turn share: where they wait (the triggerer, or the worker)
and how they find out that the txid they wait for will never commit (:mod:`airflow_transactional.watch`)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, NoReturn

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from .. import lineage
from ..coordinator import Coordinator, Transaction
from ..exceptions import WaitingForPredecessor
from ..hooks import TransactionalHook
from ..triggers import TurnTrigger
from ..watch import DELETED, Watch, run_state

__all__ = ["DELETED", "TopologyTask", "WaitingTask"]


class TopologyTask(BaseOperator):
    """Shared parts: the topology's stored declaration and the run's transaction."""

    ui_color = "#e8f4ea"
    #: Whether the task writes the topology's outputs: OpenLineage names them as its outputs.
    writes_outputs = False
    #: How often a waiting task asks Airflow about the run of the txid it waits for (seconds).
    airflow_check_interval = 5.0

    def __init__(self, *, topology: Mapping[str, Any], transactional_conn_id: str = "transactional_default",
                 blocked_grace: timedelta = timedelta(seconds=30), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.topology = dict(topology)
        self.transactional_conn_id = transactional_conn_id
        self.blocked_grace = blocked_grace

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

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """What OpenLineage hears when the task ends (:mod:`airflow_transactional.lineage`):
        the source it read, the outputs when it writes them, the run's transaction."""
        hook = TransactionalHook(self.transactional_conn_id)
        coordinator = hook.get_coordinator()
        try:
            txn = coordinator.transaction_for_run(self.topology_id, task_instance.run_id)
            commit = None
            if txn is not None and txn.committed:
                commit = next(iter(coordinator.commits(self.topology_id, txn.txid)), None)
            return lineage.operator_lineage(self.topology, hook.get_dsn(), coordinator.schema, txn, commit,
                                            writes=self.writes_outputs)
        finally:
            coordinator.close()

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return self.get_openlineage_facets_on_complete(task_instance)

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


class WaitingTask(TopologyTask):
    """A task that may have to wait for its turn (the plan for a slot, the commit for txid-1).

    A short wait stays in the worker, polling every ``poll_interval`` seconds: most waits of a
    pipeline are a commit whose predecessor commits a moment later, and resuming a deferred task
    costs Airflow a few seconds. Once the wait has lasted ``defer_after``, with
    ``deferrable=True`` (the default) it is handed to Airflow's triggerer
    (:class:`~airflow_transactional.triggers.TurnTrigger`): it holds no worker slot any more,
    shows as *deferred* in the grid, and wakes as soon as the topology commits.
    ``deferrable=False`` polls in the worker to the end. The fail-fast rules
    (:class:`~airflow_transactional.watch.Watch`) are the same either way.
    """

    def __init__(self, *, deferrable: bool = True, defer_after: timedelta = timedelta(seconds=10),
                 wait_timeout: timedelta, poll_interval: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.defer_after = defer_after
        self.wait_timeout = wait_timeout
        self.poll_interval = poll_interval

    def time_to_defer(self, waiting_since: float) -> bool:
        """Whether a wait that began at ``waiting_since`` (monotonic) moves to the triggerer now."""
        return self.deferrable and time.monotonic() - waiting_since >= self.defer_after.total_seconds()

    def deadline(self) -> float:
        """When a wait starting now gives up (seconds since the epoch: it may resume elsewhere)."""
        return time.time() + self.wait_timeout.total_seconds()

    def watch(self, context: Mapping[str, Any]) -> Watch:
        """The fail-fast rules for this task's wait, asking Airflow through this task instance."""
        return Watch(self.topology_id, lambda run_id: self.airflow_run_state(context, run_id),
                     blocked_grace=self.blocked_grace.total_seconds(), check_interval=self.airflow_check_interval,
                     log=self.log)

    def airflow_run_state(self, context: Mapping[str, Any], run_id: str) -> str | None:
        """Airflow's state of this DAG's run ``run_id``; :data:`DELETED` when Airflow has no such
        run, None when it cannot say (no task instance at hand, the API away for a moment)."""
        ti = context.get("ti")
        if ti is None:
            return None
        return run_state(lambda: ti.get_dagrun_state(dag_id=ti.dag_id, run_id=run_id), run_id, self.log)

    def wait_in_triggerer(self, context: Mapping[str, Any], *, deadline: float, waiting_for: str,
                          txid: int = 0, in_flight: list[int] | None = None) -> NoReturn:
        """Defer to the triggerer until it is worth looking again; Airflow then calls ``resume``."""
        trigger = TurnTrigger(conn_id=self.transactional_conn_id, topology_id=self.topology_id,
                              dag_id=context["ti"].dag_id, waiting_for=waiting_for, deadline=deadline, txid=txid,
                              in_flight=in_flight, blocked_grace=self.blocked_grace.total_seconds(),
                              check_interval=self.airflow_check_interval)
        self.defer(trigger=trigger, method_name="resume", kwargs={"deadline": deadline})
