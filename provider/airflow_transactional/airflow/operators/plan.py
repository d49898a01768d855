"""The plan task: gives the run its txid and fixes its batch (or takes over the batch of a run
that was deleted)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow.sdk.bases.skipmixin import SkipMixin
from airflow.sdk.exceptions import AirflowFailException

from ...coordinator import Coordinator
from ...exceptions import ConfigError, NotYourTurn
from ...model import Transaction, one_line, span_text
from ...ranges import txid_range
from ...spec import TopologySpec
from ..watch import Watch
from .base import WaitingTask
from .process import TransactionalSparkSubmitOperator


class PlanOperator(WaitingTask, SkipMixin):
    """Give this run its txid and fix its batch (idempotent: a replay gets the stored plan).

    Registers the topology first (creates/migrates tables; idempotent). When ``max_in_flight``
    txids are uncommitted it waits up to ``wait_timeout`` for one to commit (after
    ``defer_after``, in the triggerer with ``deferrable=True``, the default) -- unless an earlier
    txid failed for good, which no waiting can fix: then it fails (after ``blocked_grace``) and
    says which.

    A batch with nothing in it whose predecessor has committed is committed here, at once
    (``commit_empty``, the default): there is nothing to process -- the processing task right after
    this one is skipped from here, so it never waits for a slot of the Spark pool only to skip --
    and its commit task then only finds it committed and sends its asset events. Any other empty
    batch, or any error of that commit, is left to the commit task (and the processing task skips
    itself).
    """

    default_wait_timeout = timedelta(minutes=30)
    default_poll_interval = 2.0
    #: Whether an empty batch whose predecessor has committed is committed by this task.
    commit_empty = True

    def take_turn(self, context: Any, *, deadline: float, fresh: bool, may_wait: bool = True) -> dict[str, Any]:
        with self.coordinator() as coordinator:
            if fresh:
                coordinator.register(TopologySpec.from_config(self.topology))
            watch = self.watch(context)
            txn = self.wait_turn(coordinator, context, lambda: self.adopt_orphan(coordinator, context, watch)
                                 or self.plan_run(coordinator, context), deadline=deadline, may_wait=may_wait)
            if txn.empty and not txn.committed and self.commit_empty:
                txn = self._commit_empty(coordinator, txn)
        state = "committed" if txn.committed else "planned"
        self.log.info("run %s is txid %d of topology %s (%s, %d records; %s)", context["run_id"], txn.txid,
                      self.topology_id, state, txn.planned_records, span_text(txn.start_offsets, txn.end_offsets))
        result = {"txid": txn.txid, "records": txn.planned_records, "status": txn.status}
        processing = [t for t in (self.downstream_list if self.has_dag() else [])  # a task outside a DAG: none
                      if isinstance(t, TransactionalSparkSubmitOperator)]
        if txn.empty and txn.committed and processing:
            # Skipped now, the processing never waits for a slot of the Spark pool only to skip.
            context["ti"].xcom_push(key="return_value", value=result)  # what returning it would push
            self.log.info("txid %d is an empty batch, committed: %s skipped (no spark-submit, no Spark pool slot)",
                          txn.txid, ", ".join(t.task_id for t in processing))
            self.skip(context["ti"], processing)
        return result

    def plan_run(self, coordinator: Coordinator, context: Mapping[str, Any]) -> Transaction:
        """The run's transaction: a batch of new records; or, for a run triggered with the conf
        ``{"correct": "A..B"}``, a correction of committed txids A..B (``core/corrections.py``); or,
        with ``{"replay": {"ids": [...]}}`` (or ``{"txids": "A..B", "reason": "..."}``), a replay of
        quarantined records (``core/replays.py``). A replay or a correction refused (nothing left to
        replay, a bad range) fails the task at once: a retry would be refused the same way."""
        conf = run_conf(context)
        try:
            if conf.get(REPLAY_CONF) is not None:
                selection = conf[REPLAY_CONF]
                return coordinator.plan_replay(self.topology_id, context["run_id"],
                                               dict(selection) if isinstance(selection, Mapping) else {"?": selection})
            asked = correction_asked(context)
            if asked is not None:
                return coordinator.plan_correction(self.topology_id, context["run_id"], *asked)
        except ConfigError as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from exc
        return coordinator.plan(self.topology_id, context["run_id"])

    def _commit_empty(self, coordinator: Coordinator, txn: Transaction) -> Transaction:
        """The empty batch ``txn``, committed now if its turn has come (its metrics sent), else as it was."""
        began = time.monotonic()
        try:
            result = coordinator.commit(self.topology_id, txn.txid)
        except NotYourTurn:  # txid-1 is not committed yet: the commit task waits for it
            return txn
        except Exception as exc:  # the commit task commits it, or fails saying why
            self.log.warning("txid %d is an empty batch; committing it here failed, its commit task will try: %s",
                             txn.txid, one_line(str(exc)) or type(exc).__name__)
            return txn
        if result.committed:
            self.report_commit(coordinator, txn.txid, time.monotonic() - began)
        self.log.info("%s", result.message)
        return coordinator.transaction(self.topology_id, txn.txid)

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


#: The keys of a run's conf that make it a correction (``{"correct": "3..7"}``) or a replay
#: (``{"replay": {"ids": [12, 13]}}``).
CORRECT_CONF, REPLAY_CONF = "correct", "replay"


def run_conf(context: Mapping[str, Any]) -> Mapping[str, Any]:
    conf = getattr(context.get("dag_run"), "conf", None) or {}
    return conf if isinstance(conf, Mapping) else {}


def correction_asked(context: Mapping[str, Any]) -> tuple[int, int] | None:
    """The txids a run's conf asks it to correct (None: a run of new records)."""
    conf = run_conf(context)
    return None if conf.get(CORRECT_CONF) is None else txid_range(conf[CORRECT_CONF])

