"""spark-submit in one place: its command line, what it ships, and how the DSN reaches a driver.

* :func:`spark_submit_argv`: every job's command line up to its application (the process task
  goes through the Apache Spark provider's hook instead, which builds the same shape);
* :func:`provider_zip`: this package as ``--py-files``, so executors on a cluster import it;
* :func:`with_quiet_driver_logs`: the driver's log4j at WARN, so a task log shows the job;
* :data:`LOCAL_SPARK_CONF`: settings for small batches on one machine;
* :func:`with_jit_for_batch`: a local driver's JIT chosen by the planned batch's size;
* :func:`.auth.with_authentication` on every command line: Spark's own ports ask for a secret;
* :func:`deliver_dsn`: the state store's DSN, never on a command line, never in a pod spec.

How the DSN travels, and why:

``spark-submit`` arguments show in ``ps`` on the submitting machine, and the Apache Spark
provider turns ``env_vars`` into ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*``
arguments for YARN and Kubernetes masters (and refuses them outright for a standalone master in
cluster mode). So the DSN travels the way each cluster manager keeps a secret:

* a driver on this machine (``local[N]``, and any master in client mode): a file readable only
  by this user, written for the one job and removed after it; the driver gets its *path*
  (``--dsn-file``);
* YARN, cluster mode: the same file shipped with ``--files``; YARN localizes it into the
  application's private container directory, where the driver reads it by name;
* Kubernetes, cluster mode: a Kubernetes secret the operator names (``kubernetes_dsn_secret=
  "name:key"``), mounted into the driver's environment by reference
  (``spark.kubernetes.driver.secretKeyRef``); the DSN itself never leaves the secret;
* a standalone master (``spark://``) runs a Python application in client mode only: Spark
  itself refuses cluster mode there, so :func:`check_deploy_mode` refuses it first, naming the
  fix (the driver then runs beside the task, the executors on the cluster's workers).

Executors never get the driver's file, nor the DSN inside a task: the driver hands them a file of
the DSN alone through Spark (:mod:`.handoff`).

The same file carries the settings of the source's connection when the job needs them (a Kafka
topic's broker and credentials): then it holds JSON, ``{"dsn": ..., "connections": {id: extra}}``
-- also the form to put in the Kubernetes secret.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import files
from ..connections import DSN_ENV, DSN_FILE_ENV, dsn_and_connections, read_dsn_file
from ..exceptions import ConfigError, TransactionalError
from ..model import FileBatch, planned_batch
from .auth import spark_defaults, with_authentication

log = logging.getLogger(__name__)

# Spark settings for small batches on one machine (``local[N]``): no UI, few shuffle partitions,
# and a JVM tuned for a short life: only the C1 JIT and the serial GC cut a small batch's CPU
# time by ~40% (drop them for batches that keep the JVM busy for minutes).
LOCAL_SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.memory": "1g",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}

#: Set (to a ``spark_connect`` connection id) where DAG files are parsed, it moves every topology
#: declared with :func:`spark_backend` onto that Spark Connect server.
SPARK_CONNECT_CONN_ENV = "AIRFLOW_TXN_SPARK_CONNECT_CONN_ID"


def spark_backend(spark_conf: Mapping[str, str] = LOCAL_SPARK_CONF) -> dict[str, Any]:
    """A ``transactional_dag``'s Spark, one switch away from Spark Connect: ``spark_conf`` (a
    ``spark-submit`` per batch), or -- with ``$AIRFLOW_TXN_SPARK_CONNECT_CONN_ID`` set where the DAG
    files are parsed -- that connection as ``spark_connect_conn_id`` (each batch a client of a warm
    server: no JVM start per batch). Pass it as ``transactional_dag(..., **spark_backend())``."""
    conn_id = os.environ.get(SPARK_CONNECT_CONN_ENV, "").strip()
    return {"spark_connect_conn_id": conn_id} if conn_id else {"spark_conf": dict(spark_conf)}


DSN_FILE_ARG = "--dsn-file"
#: The name YARN gives the shipped DSN file in the driver's container.
YARN_DSN_NAME = "airflow_txn_dsn"
#: A DSN file older than this belongs to no running job (a killed task could not remove it).
STALE_DSN_FILE_SECONDS = 7 * 24 * 3600
#: Where a driver's DSN files go when set (a stack's own directory, removed with it), else the
#: cache directory's ``dsn/``.
SECRETS_DIR_ENV = "AIRFLOW_TXN_SECRETS_DIR"
K8S_SECRET_CONF = f"spark.kubernetes.driver.secretKeyRef.{DSN_ENV}"
_K8S_SECRET_REF = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?:[-._a-zA-Z0-9]+")
#: Kubernetes' limits: a secret's name is a DNS subdomain (253 characters), a key at most 253.
_K8S_NAME_MAX = 253


@dataclass(frozen=True)
class DsnDelivery:
    """What one ``spark-submit`` adds to carry the DSN: application arguments, ``--files``
    entries and ``--conf`` settings (none of them secret), and the local file to remove after."""

    app_args: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    conf: dict[str, str] = field(default_factory=dict)
    local_file: Path | None = None

    def remove(self) -> None:
        if self.local_file is not None:
            self.local_file.unlink(missing_ok=True)


def secrets_text(dsn: str, connections: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """What a DSN file holds: the DSN, or JSON of it and the source connections' settings."""
    return json.dumps({"dsn": dsn, "connections": dict(connections)}) if connections else dsn


def write_dsn_file(dsn: str, prefix: str = "dsn-") -> Path:
    """A new file, mode 0600 from creation, holding ``dsn`` (see :func:`secrets_text`; or, named by
    ``prefix``, another file a driver reads), in the provider's private directory (:data:`SECRETS_DIR_ENV`)."""
    configured = os.environ.get(SECRETS_DIR_ENV)
    home = files.private_dir(Path(configured) if configured else files.cache_dir() / "dsn")
    stale = time.time() - STALE_DSN_FILE_SECONDS
    for old in home.glob(f"{prefix}*"):  # left by a job whose task was killed before it could remove it
        if old.stat().st_mtime < stale:
            old.unlink(missing_ok=True)
    fd, name = tempfile.mkstemp(prefix=prefix, dir=home)  # 0600
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(dsn)
    return Path(name)


def deliver_dsn(dsn: str, master: str, deploy_mode: str | None, *, kubernetes_dsn_secret: str | None = None,
                connections: Mapping[str, Mapping[str, Any]] | None = None) -> DsnDelivery:
    """How the DSN (and the source ``connections`` the job reads with) reach a driver of
    ``master`` in ``deploy_mode`` (see the module docstring)."""
    cluster = deploy_mode == "cluster"
    if master.startswith("k8s://") and cluster:
        if connections and kubernetes_dsn_secret:
            log.info("the driver takes the source connections %s from the Kubernetes secret %s: put "
                     '{"dsn": ..., "connections": {...}} in it', sorted(connections), kubernetes_dsn_secret)
        if not kubernetes_dsn_secret:
            raise ConfigError("a k8s:// master in cluster mode needs the DSN in a Kubernetes secret: create one "
                              "(kubectl create secret generic txn-store --from-literal=dsn='postgresql://...') "
                              "and pass kubernetes_dsn_secret='txn-store:dsn'")
        check_kubernetes_secret(kubernetes_dsn_secret)
        return DsnDelivery(conf={K8S_SECRET_CONF: kubernetes_dsn_secret})
    path = write_dsn_file(secrets_text(dsn, connections))
    if master.startswith("yarn") and cluster:
        return DsnDelivery([DSN_FILE_ARG, YARN_DSN_NAME], [f"{path}#{YARN_DSN_NAME}"], local_file=path)
    return DsnDelivery([DSN_FILE_ARG, str(path)], local_file=path)


def check_deploy_mode(master: str, deploy_mode: str | None, conf: Mapping[str, Any], application: str) -> None:
    """Refuse what spark-submit would refuse after a JVM start: a Python application in cluster
    mode on a standalone master ("Cluster deploy mode is currently not supported for python
    applications on standalone clusters", Spark 4.2's ``SparkSubmit``). The mode is the
    connection's ``deploy-mode``, else ``spark.submit.deployMode`` in the conf, as spark-submit reads it."""
    mode = deploy_mode or conf.get("spark.submit.deployMode")
    if master.startswith("spark://") and mode == "cluster" and application.endswith(".py"):
        raise ConfigError(f"a standalone master ({master}) runs Python applications in client mode only: set "
                          "deploy-mode to client in the Spark connection (not spark.submit.deployMode=cluster); "
                          "the driver then runs beside the task, the executors on the cluster")
    if master.startswith("k8s://") and mode == "cluster" and not (
            conf.get(K8S_UPLOAD_PATH) or spark_defaults().get(K8S_UPLOAD_PATH)):
        # Spark 4.2's KubernetesUtils.uploadFileUri: "Please specify spark.kubernetes.file.upload.path property."
        raise ConfigError(f"a k8s:// master in cluster mode starts the driver in a pod, which cannot read the job "
                          f"{application} or the provider's zip from this machine: set "
                          f"spark_conf={{'{K8S_UPLOAD_PATH}': 's3a://bucket/spark-uploads'}} (a path every pod can "
                          "read; spark-submit uploads both there), or run in client mode (the driver in the task pod)")


#: Where spark-submit uploads a cluster-mode driver's local files for Kubernetes.
K8S_UPLOAD_PATH = "spark.kubernetes.file.upload.path"


def check_kubernetes_secret(ref: Any) -> str:
    """``ref`` when it is ``'secret-name:key'`` as Kubernetes allows them, else a ConfigError."""
    if (not isinstance(ref, str) or not _K8S_SECRET_REF.fullmatch(ref)
            or any(len(part) > _K8S_NAME_MAX for part in ref.split(":", 1))):
        shown = ref if not isinstance(ref, str) or len(ref) <= 80 else f"{ref[:60]}... ({len(ref)} characters)"
        raise ConfigError(f"kubernetes_dsn_secret must be 'secret-name:key' (a secret name of lower-case letters, "
                          f"digits, '-' and '.', and a key, each at most {_K8S_NAME_MAX} characters), got {shown!r}")
    return ref


def driver_dsn(dsn_file: str | None) -> str:
    """The DSN inside a driver: ``--dsn-file``, else ``$AIRFLOW_TXN_DSN_FILE``, else ``$AIRFLOW_TXN_DSN``."""
    return driver_secrets(dsn_file)[0]


def driver_secrets(dsn_file: str | None) -> tuple[str, dict[str, dict[str, Any]]]:
    """The DSN inside a driver and the source connections' settings that came with it (see
    :func:`secrets_text`): ``--dsn-file``, else ``$AIRFLOW_TXN_DSN_FILE``, else ``$AIRFLOW_TXN_DSN``."""
    path = dsn_file or os.environ.get(DSN_FILE_ENV)
    if path:
        text = read_dsn_file(path, owner_only=False)
    else:
        text = os.environ.get(DSN_ENV, "")
        if not text:
            raise ConfigError(f"no state store DSN: the processing operator passes {DSN_FILE_ARG}; when running a "
                              f"job by hand set ${DSN_ENV} or ${DSN_FILE_ENV}")
    return dsn_and_connections(text)


# -- the command line ---------------------------------------------------------------------

def spark_submit() -> str:
    """``$SPARK_SUBMIT``, else the spark-submit on PATH, else the one installed beside this Python."""
    found = os.environ.get("SPARK_SUBMIT") or shutil.which("spark-submit")
    if not found:
        beside = os.path.join(os.path.dirname(sys.executable), "spark-submit")
        found = beside if os.access(beside, os.X_OK) else None
    if not found:
        raise TransactionalError("spark-submit was not found: put Spark's bin directory on PATH or set "
                                 "SPARK_SUBMIT to the spark-submit to use")
    return found


def spark_submit_argv(master: str, conf: Mapping[str, Any], *options: str,
                      env: Mapping[str, str] | None = None) -> list[str]:
    """``spark-submit --master MASTER OPTIONS --conf key=value ...``: every job's command line up to
    its application, Spark's authentication on (:func:`with_authentication`; ``env``: the
    environment spark-submit will run in, default this process's)."""
    return [spark_submit(), "--master", master, *options,
            *(arg for key, value in with_authentication(conf, master, env).items()
              for arg in ("--conf", f"{key}={value}"))]


def provider_zip() -> str:
    """The provider package as a zip for ``--py-files``, so executors on a cluster import it.

    Built in memory once per process with fixed timestamps (the same sources give the same bytes)
    and kept as a private file (:func:`files.artifact`), checked -- its directory's way, its
    digest -- at every call: never a file someone else could plant or swap.
    """
    return str(files.artifact("airflow_transactional", ".zip", _provider_zip_bytes()))


@functools.cache
def _provider_zip_bytes() -> bytes:
    pkg = Path(__file__).resolve().parents[1]  # the package, not this module's spark/
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted([*pkg.rglob("*.py"), *pkg.rglob("*.sql")]):
            info = zipfile.ZipInfo(str(p.relative_to(pkg.parent)), date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, p.read_bytes())
    return buf.getvalue()


LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.spark_job.name = org.apache.spark.deploy
logger.spark_job.level = warn
logger.master.name = org.apache.spark.deploy.client
logger.master.level = info
"""
# The last two lines: a standalone master's word to the driver (connected, executors granted, and
# "Master has changed" once a restarted master recovered the application), which the process
# task's watch of a lost master reads (airflow.operators.masterwatch).


def quiet_log_config() -> str:
    """A log4j2 file that keeps Spark's driver at WARN (task logs show the job, not the JVM),
    checked at every call as :func:`provider_zip` is."""
    return str(files.artifact("airflow_transactional-log4j2", ".properties", LOG4J2.encode()))


def with_quiet_driver_logs(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` with the driver's log4j config added to its Java options (a user's own one wins)."""
    out = dict(conf)
    java_opts = str(out.get("spark.driver.extraJavaOptions") or "")
    if "-Dlog4j2.configurationFile" not in java_opts:
        out["spark.driver.extraJavaOptions"] = " ".join(
            filter(None, [java_opts, f"-Dlog4j2.configurationFile=file:{quiet_log_config()}"]))
    return out


#: Up to this input a local driver JVM whose Java options choose no JIT runs with C1 only (a
#: one-shot JVM does not live long enough to repay the full JIT's compiling), the full JIT above;
#: the event log does more per event than a landing file, so its bound is lower. Chosen with the
#: ``work`` rows of ``bench.perf`` (docs/benchmarks.md says how the JIT was weighed).
SHORT_JIT_MAX_RECORDS = 250_000
SHORT_JIT_MAX_BYTES = 128 << 20
SHORT_JIT = "-XX:TieredStopAtLevel=1"

#: The niceness of a verify job's processes on the machine that starts them (the driver, and a
#: ``local[N]`` master's executors): the lowest CPU priority, so that where the processing keeps
#: the cores busy, a round of the shadow audit takes what it leaves.
VERIFY_NICENESS = 19


def lowest_priority() -> None:
    """Run at :data:`VERIFY_NICENESS` (a ``preexec_fn`` of the verify job's ``spark-submit``)."""
    os.nice(VERIFY_NICENESS)


def with_jit_for_batch(conf: Mapping[str, Any], batch: Mapping[str, Any], planned_records: int) -> dict[str, Any]:
    """``conf`` for a driver on this machine in ``local[N]`` mode, with the JIT chosen for the
    planned batch: C1 only for a small one (a one-shot JVM does not live long enough to repay the
    full JIT's compiling), the full JIT for a big one. Java options that already name a JIT
    setting (``TieredStopAtLevel``, ``TieredCompilation``) are the user's choice and win. A batch
    of files is sized by its bytes (text formats only: a Parquet file's bytes say little about its
    records), any other by its records."""
    out = dict(conf)
    java_opts = str(out.get("spark.driver.extraJavaOptions") or "")
    if "TieredStopAtLevel" in java_opts or "TieredCompilation" in java_opts:
        return out
    typed = planned_batch(batch)
    if isinstance(typed, FileBatch):
        if typed.format == "parquet":
            return out
        small = sum(int(f.get("size") or 0) for f in typed.files) <= SHORT_JIT_MAX_BYTES
    else:
        small = planned_records <= SHORT_JIT_MAX_RECORDS
    if small:
        out["spark.driver.extraJavaOptions"] = " ".join(filter(None, [SHORT_JIT, java_opts]))
    return out
