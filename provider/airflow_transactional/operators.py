"""The three tasks of a transaction run: plan, process (spark-submit), commit.

Operators keep their arguments in ``__init__`` and build hooks in ``execute``; nothing here
touches a database at DAG-parse time. Order is enforced in PostgreSQL, not by
``depends_on_past`` (see :mod:`airflow_transactional.dag` for why).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from . import spark_cds
from .coordinator import Coordinator, Transaction
from .exceptions import TooManyInFlight, WaitingForPredecessor
from .hooks import TransactionalHook
from .spark_job import REMOTE_ENV
from .spec import TopologySpec
from .submit import DSN_ENV, DsnDelivery, deliver_dsn, provider_zip, with_quiet_driver_logs

# What Spark, Hadoop and PySpark print on every run that says nothing about this job (the
# driver's log4j is at WARN already): kept for the message of a failed job, left out of the log.
_SPARK_NOISE = re.compile(r"^(\d\d/\d\d/\d\d )?\d\d:\d\d:\d\d WARN |FutureWarning|warnings\.warn\(|"
                          r"require_minimum_pandas_version\(\)")

#: What :meth:`_TopologyTask.airflow_run_state` says of a run Airflow no longer has.
DELETED = "deleted"


def _not_found(exc: Exception) -> bool:
    """Whether a Task SDK call failed because the api-server has no such object (HTTP 404)."""
    detail = getattr(getattr(exc, "error", None), "detail", None)
    return isinstance(detail, dict) and detail.get("status_code") == 404


class _TopologyTask(BaseOperator):
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


class PlanOperator(_TopologyTask):
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


class TransactionalSparkSubmitOperator(_TopologyTask, SparkSubmitOperator):
    """``spark-submit`` of the processing job for this run's txid (a new attempt each try).

    Empty batches and already committed txids cost no ``spark-submit``: the task is skipped and
    says why. With ``reuse_staged_output`` (the default) neither does a txid whose current plan
    already has a complete attempt (a run cleared or backfilled after its processing finished):
    the commit takes that attempt. The state store's DSN reaches the driver in the environment,
    never in argv.

    With ``spark_connect_conn_id`` (a ``spark_connect`` connection of the Apache Spark provider)
    the job runs against that long-lived Spark instead: the same job file under this worker's
    Python as a Spark Connect client -- no JVM start-up per batch.
    """

    ui_color = "#fdf0e0"

    def __init__(self, *, reuse_staged_output: bool = True, spark_connect_conn_id: str | None = None,
                 kubernetes_dsn_secret: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reuse_staged_output = reuse_staged_output
        self.spark_connect_conn_id = spark_connect_conn_id
        self.kubernetes_dsn_secret = kubernetes_dsn_secret
        self.base_application_args = list(self.application_args or [])
        self._client: subprocess.Popen[str] | None = None

    def execute(self, context: Any) -> None:
        hook = TransactionalHook(self.transactional_conn_id)
        coordinator = hook.get_coordinator()
        delivery: DsnDelivery | None = None
        try:
            txn = self.run_transaction(coordinator, context)
            if txn.committed:
                self.skip(f"txid {txn.txid} already committed at {txn.committed_at}; nothing to do")
            coordinator.retrying(self.topology_id, txn.txid)
            if txn.empty:
                self.skip(f"txid {txn.txid} is an empty batch: no spark-submit")
            done = coordinator.latest_complete_attempt(self.topology_id, txn.txid) if self.reuse_staged_output else None
            if done is not None:
                self.skip(f"txid {txn.txid}: attempt {done[0]} of its current plan completed at {done[1]}; reusing "
                          "its staged output (no spark-submit). Set reuse_staged_output=False to recompute on every "
                          "clear")
            self.log.info("processing txid %d of topology %s (%d records)%s", txn.txid, self.topology_id,
                          txn.planned_records, " on Spark Connect" if self.spark_connect_conn_id else "")
            if self.spark_connect_conn_id:
                self.application_args = self.job_args(txn.txid, coordinator.schema)
                with self.failing_for_good(coordinator, context, "the Spark Connect job"):
                    self.run_connect_client(self.spark_connect_conn_id, hook.get_dsn())
                return
            delivery = self.prepare_submit(txn.txid, coordinator.schema, hook.get_dsn())
            with self.failing_for_good(coordinator, context, "spark-submit"):
                super().execute(context)
        finally:
            if delivery is not None:
                delivery.remove()
            coordinator.close()

    def _get_hook(self) -> SparkSubmitHook:
        """The Spark provider's hook, whose log of spark-submit's output leaves Spark's routine
        warnings out (a failed job's error message still ends with them, as the hook keeps them)."""
        hook = super()._get_hook()
        process = hook._process_spark_submit_log

        def quiet(lines: Iterator[Any]) -> None:
            def relevant() -> Iterator[Any]:
                for line in lines:
                    if isinstance(line, str) and _SPARK_NOISE.search(line):
                        hook._last_submit_log_lines.append(line.strip())
                        continue
                    yield line

            process(relevant())

        hook._process_spark_submit_log = quiet  # type: ignore[method-assign,assignment]  # one hook, one job
        return hook

    def skip(self, reason: str) -> NoReturn:
        """Skip this task, saying why as the first line of its log (not only in a collapsed group)."""
        self.log.info("%s", reason)
        raise AirflowSkipException(reason)

    def job_args(self, txid: int, schema: str) -> list[str]:
        return [*self.base_application_args, "--topology", self.topology_id, "--txid", str(txid), "--schema", schema]

    def prepare_submit(self, txid: int, schema: str, dsn: str) -> DsnDelivery:
        """Set this operator's ``spark-submit`` arguments for ``txid``; returns how the DSN travels
        (:mod:`submit`: never in argv or ``env_vars``), whose local file the caller removes after."""
        probe = self._get_hook()  # resolves the Spark connection: its master and deploy mode
        master, deploy_mode = str(probe._connection["master"]), probe._connection["deploy_mode"]
        delivery = deliver_dsn(dsn, master, deploy_mode, kubernetes_dsn_secret=self.kubernetes_dsn_secret)
        self.application_args = [*self.job_args(txid, schema), *delivery.app_args]
        if deploy_mode != "cluster":  # this machine's Python and loopback, for a driver on this machine
            python = os.environ.get("PYSPARK_PYTHON", sys.executable)
            self.env_vars = {**(self.env_vars or {}), "PYSPARK_PYTHON": python,
                             **({} if "SPARK_LOCAL_IP" in os.environ else {"SPARK_LOCAL_IP": "127.0.0.1"})}
        self.files = ",".join(filter(None, [self.files, *delivery.files])) or None
        self.py_files = ",".join(filter(None, [self.py_files, provider_zip()]))
        conf = {**(self.conf or {}), **delivery.conf}
        if deploy_mode != "cluster":  # files of this machine, for a driver on this machine
            conf = spark_cds.with_archive(with_quiet_driver_logs(conf), self.startup_archive())
        self.conf = conf
        return delivery

    def startup_archive(self) -> Path | None:
        """The class-data-sharing archive for a driver that runs on this machine, if one was built."""
        if not spark_cds.enabled() or self._deploy_mode == "cluster":
            return None
        archive = spark_cds.current()
        if archive is None:
            self.log.info("no class-data-sharing archive for this JVM and Spark: `airflow-txn spark-cds` builds one "
                          "(a small batch then costs about a fifth less CPU and time)")
        else:
            self.log.info("the driver JVM starts from the class-data-sharing archive %s", archive)
        return archive

    def run_connect_client(self, conn_id: str, dsn: str) -> None:
        """Run the job file as a Spark Connect client (a process of this worker); its output goes
        to this task's log. The DSN and the URL (it may hold a token) go in its environment only."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        url = SparkConnectHook(conn_id).get_connection_url()
        env = {**os.environ, **(self.env_vars or {}), REMOTE_ENV: url, DSN_ENV: dsn,
               "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        argv = [sys.executable, self.application, *(self.application_args or [])]
        self._client = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        tail: list[str] = []
        assert self._client.stdout is not None
        for line in self._client.stdout:
            line = line.rstrip()
            if line and "FutureWarning" not in line and "require_minimum_pandas_version" not in line:
                self.log.info("%s", line)
                tail = [*tail[-19:], line]
        code = self._client.wait()
        self._client = None
        if code:
            last = "\n".join(tail[-5:])
            raise AirflowException(f"the Spark Connect job {os.path.basename(self.application)} exited with {code}:\n"
                                   f"{last}")

    def on_kill(self) -> None:
        client = self._client
        if client is not None and client.poll() is None:
            os.killpg(client.pid, signal.SIGTERM)
            return
        super().on_kill()


class CommitOperator(_TopologyTask):
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
