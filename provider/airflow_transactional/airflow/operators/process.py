"""The process task: spark-submit of the topology's job for the run's txid (or a client of a
long-lived Spark Connect server), with the DSN delivered out of argv and Spark's routine noise
left out of the task log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from ... import faults
from ...coordinator import Coordinator
from ...model import Transaction
from ...sources import Source, source_from_config
from ...sources.base import connections_for
from ...spark import cds
from ...spark.auth import with_authentication
from ...spark.jars import jars_for
from ...spark.recompute import connect_client_env
from ...spark.submit import (
    SHORT_JIT,
    DsnDelivery,
    check_deploy_mode,
    deliver_dsn,
    provider_zip,
    with_jit_for_batch,
    with_quiet_driver_logs,
)
from .. import lineage, spark_provider
from ..hooks import AIRFLOW_CONNECTIONS, TransactionalHook
from .base import TopologyTask
from .masterwatch import TIMEOUT as MASTER_LOST_TIMEOUT
from .masterwatch import MasterWatch

# What Spark, Hadoop and PySpark print on every run that says nothing about this job (the
# driver's log4j is at WARN already): kept for the message of a failed job, left out of the log.
_SPARK_NOISE = re.compile(r"^(\d\d/\d\d/\d\d )?\d\d:\d\d:\d\d WARN |FutureWarning|warnings\.warn\(|"
                          r"require_minimum_pandas_version\(\)")



class TransactionalSparkSubmitOperator(TopologyTask, SparkSubmitOperator):
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
        # Spark's own lineage events (the OpenLineage Spark listener, where the cluster has it)
        # name this task as their parent -- when OpenLineage is here to say who that is.
        kwargs.setdefault("openlineage_inject_parent_job_info", lineage.installed())
        # Each try is a new attempt, never a re-attach to an earlier try's driver (Airflow 3.3's
        # resumable jobs): that driver may be processing a plan the txid no longer has, and its
        # "succeeded" would skip the recompute reuse_staged_output=False asks for. The commit takes
        # one complete attempt of the current plan, so a lost try's driver that runs on (cluster
        # deploy mode) costs work, never a double count.
        kwargs.setdefault("durable", False)
        super().__init__(**kwargs)
        self.reuse_staged_output = reuse_staged_output
        self.spark_connect_conn_id = spark_connect_conn_id
        self.kubernetes_dsn_secret = kubernetes_dsn_secret
        self.base_application_args = list(self.application_args or [])
        self._client: subprocess.Popen[str] | None = None
        self.dag_version: str | None = None  # of the try running: recorded with its attempt

    def execute(self, context: Any) -> None:
        hook = TransactionalHook(self.transactional_conn_id)
        delivery: DsnDelivery | None = None
        with hook.coordinator() as coordinator:
            try:
                txn = self.run_transaction(coordinator, context)
                self.dag_version = dag_version(context)
                faults.point("process.begin", scope=(self.topology_id, str(txn.txid)))
                self._skip_unless_work(coordinator, txn)
                self.log.info("processing txid %d of topology %s (%d records)%s", txn.txid, self.topology_id,
                              txn.planned_records, " on Spark Connect" if self.spark_connect_conn_id else "")
                if self.spark_connect_conn_id:
                    self.application_args = self.job_args(txn.txid, coordinator.schema)
                    with self.failing_for_good(coordinator, context, "the Spark Connect job"):
                        self.run_connect_client(self.spark_connect_conn_id, hook.get_dsn())
                    return
                with self.failing_for_good(coordinator, context, "spark-submit"):
                    delivery = self.prepare_submit(txn.txid, coordinator.schema, hook.get_dsn(), batch=txn.batch,
                                                   planned_records=txn.planned_records)
                    super().execute(context)
            finally:
                if delivery is not None:
                    delivery.remove()

    def _skip_unless_work(self, coordinator: Coordinator, txn: Transaction) -> None:
        """Skip the task when the txid needs no processing: committed, empty, or (reusing staged
        output) an attempt of its current plan completed. A txid it processes is live again."""
        if txn.committed:  # an empty batch: by its plan task, as a rule
            empty = " (an empty batch: no spark-submit)" if txn.empty else ""
            self.skip(f"txid {txn.txid}{empty} already committed at {txn.committed_at}; nothing to do")
        coordinator.lift_failed(self.topology_id, txn.txid)
        if txn.empty:
            self.skip(f"txid {txn.txid} is an empty batch: no spark-submit")
        done = coordinator.latest_complete_attempt(self.topology_id, txn.txid) if self.reuse_staged_output else None
        if done is not None:
            self.skip(f"txid {txn.txid}: attempt {done[0]} of its current plan completed at {done[1]}; reusing "
                      "its staged output (no spark-submit). Set reuse_staged_output=False to recompute on every "
                      "clear")

    def _get_hook(self) -> SparkSubmitHook:
        """The Spark provider's hook, whose log of spark-submit's output leaves Spark's routine
        warnings out (a failed job's error message still ends with them, as the hook keeps them)."""
        hook = super()._get_hook()

        def quiet(log: Callable[[Iterator[Any]], None], lines: Iterator[Any]) -> None:
            # A driver its standalone master forgot: failed, not left waiting ([transactional] master_lost_timeout).
            watch = MasterWatch(lambda: spark_provider.kill_submit(hook), self.log,
                                conf.getfloat("transactional", "master_lost_timeout", fallback=MASTER_LOST_TIMEOUT))

            def relevant() -> Iterator[Any]:
                for line in lines:
                    if isinstance(line, str):
                        watch.see(line)
                        if _SPARK_NOISE.search(line):
                            spark_provider.keep_for_error(hook, line)
                            continue
                    yield line

            try:
                log(relevant())
            finally:
                watch.stop()

        spark_provider.read_log_with(hook, quiet)  # one hook, one job
        return hook

    def skip(self, reason: str) -> NoReturn:
        """Skip this task, saying why as the first line of its log (not only in a collapsed group)."""
        self.log.info("%s", reason)
        raise AirflowSkipException(reason)

    def job_args(self, txid: int, schema: str) -> list[str]:
        version = ["--dag-version", self.dag_version] if self.dag_version else []
        return [*self.base_application_args, "--topology", self.topology_id, "--txid", str(txid), "--schema", schema,
                *version]

    def prepare_submit(self, txid: int, schema: str, dsn: str, *, batch: Mapping[str, Any] | None = None,
                       planned_records: int = 0) -> DsnDelivery:
        """Set this operator's ``spark-submit`` arguments for ``txid``; returns how the DSN travels
        (:mod:`...spark.submit`: never in argv or ``env_vars``), whose local file the caller removes after.
        Given the planned ``batch``, a ``local[N]`` driver's JIT is chosen by its size
        (:func:`...spark.submit.with_jit_for_batch`)."""
        probe = self._get_hook()  # resolves the Spark connection: its master and deploy mode
        master, deploy_mode = spark_provider.master_and_deploy_mode(probe)
        check_deploy_mode(master, deploy_mode, self.conf or {}, self.application)
        source = self.source()
        delivery = deliver_dsn(dsn, master, deploy_mode, kubernetes_dsn_secret=self.kubernetes_dsn_secret,
                               connections=connections_for(source) if source else None)
        if source is not None:  # Spark's Kafka connector or s3a, unless the settings bring the cluster's
            self.jars = ",".join(filter(None, [self.jars, *jars_for(source, self.conf or {})])) or None
        shipped = self.ship_request(deploy_mode)
        self.application_args = [*self.job_args(txid, schema), *delivery.app_args]
        if deploy_mode != "cluster":  # the driver runs here, under this machine's Python
            python = os.environ.get("PYSPARK_PYTHON", sys.executable)
            # Loopback only when the executors run here too: executors on other hosts (a standalone,
            # YARN or Kubernetes cluster in client mode) connect back to the driver's address.
            loopback = master.startswith("local") and "SPARK_LOCAL_IP" not in os.environ
            self.env_vars = {**(self.env_vars or {}), "PYSPARK_PYTHON": python,
                             **({"SPARK_LOCAL_IP": "127.0.0.1"} if loopback else {})}
        self.files = ",".join(filter(None, [self.files, *delivery.files, *shipped])) or None
        self.py_files = ",".join(filter(None, [self.py_files, provider_zip()]))
        conf = with_authentication({**(self.conf or {}), **delivery.conf}, master)
        if batch is not None and master.startswith("local"):
            chosen = with_jit_for_batch(conf, batch, planned_records)
            if chosen != conf:
                self.log.info("a small batch: the driver JVM runs with the C1 JIT only (%s)", SHORT_JIT)
            conf = chosen
        if deploy_mode != "cluster":  # files of this machine, for a driver on this machine
            startup = self.startup_archive(master)
            conf = cds.with_archive(with_quiet_driver_logs(conf), startup)
            if shared_home := cds.env_of(startup):
                self.env_vars = {**(self.env_vars or {}), **shared_home}
        self.conf = conf
        return delivery

    def ship_request(self, deploy_mode: str | None) -> list[str]:
        """Ready the job's own request for a driver in ``deploy_mode`` (None: a Spark Connect client)
        before :meth:`job_args` names it; returns the ``--files`` entries that ship it. The process
        task's job has none: its txid is its request."""
        return []

    def source(self) -> Source | None:
        """The topology's source, as declared (None for a declaration without one: a test's)."""
        config = self.topology.get("source")
        return source_from_config(config, AIRFLOW_CONNECTIONS) if config else None

    def startup_archive(self, master: str) -> cds.Startup | None:
        """The class-data-sharing archive for a driver that runs on this machine, if one was built."""
        if not cds.enabled() or spark_provider.deploy_mode_argument(self) == "cluster":
            return None
        startup = cds.current()
        # A shared archive needs the driver started from the shared Spark home: the environment of
        # the spark-submit process, which Airflow's hook sets itself only for a local or standalone master.
        if startup is not None and startup.spark_home is not None and not master.startswith(("local", "spark://")):
            startup = None
        if startup is None:
            self.log.info("no class-data-sharing archive for this JVM and Spark: `airflow-txn spark-cds` builds one "
                          "(a small batch then costs about a fifth less CPU and time)")
        else:
            self.log.info("the driver JVM starts from the class-data-sharing archive %s", startup.archive)
        return startup

    def run_connect_client(self, conn_id: str, dsn: str) -> None:
        """Run the job file as a Spark Connect client (a process of this worker); its output goes
        to this task's log. The DSN and the URL (it may hold a token) go in its environment only."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        url = SparkConnectHook(conn_id).get_connection_url()
        env = connect_client_env(url, dsn, self.source(), self.py_files, {**os.environ, **(self.env_vars or {})})
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




def dag_version(context: Any) -> str | None:
    """The DAG version a task's try runs (its id, and the bundle's version when it has one)."""
    ti = context.get("ti") if hasattr(context, "get") else None
    version = getattr(ti, "dag_version_id", None)
    bundle = getattr(getattr(ti, "bundle_instance", None), "version", None)
    if version is None:
        return None
    return f"{version}@{bundle}" if bundle else str(version)
