"""The owner's recomputations, ``airflow-txn audit`` and ``rebuild``: the topology's own Spark job
in its ``--audit`` or ``--rebuild`` mode -- under ``spark-submit``, or as a client of a Spark Connect
server (a process of this machine, as the process task runs it) -- its summary read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from ..connections import redact
from ..exceptions import TransactionalError
from ..sources import Source
from ..sources.base import connections_for
from ..spec import TopologySpec
from . import cds
from .jars import jars_for
from .job import REMOTE_ENV
from .submit import (
    DSN_ENV,
    deliver_dsn,
    provider_zip,
    secrets_text,
    spark_submit_argv,
    with_jit_for_batch,
    with_quiet_driver_logs,
)


def recompute(dsn: str, schema: str, spec: TopologySpec, mode: str, *, master: str, conf: list[str],
              records: int | None = None, mode_value: str | None = None, remote: str | None = None) -> dict[str, Any]:
    """Run ``spec``'s Spark job in ``mode`` (``audit``, ``rebuild``, or ``preview`` of the txids
    ``mode_value`` names) on ``master`` -- or, given ``remote`` (a Spark Connect URL, which may hold
    a token), as a client of that server; its summary.
    ``records`` (what the topology committed, if known) picks a local driver's JIT as the process
    task picks it for a batch of that size."""
    topology_id = spec.topology_id
    job = spec.job
    if job is None:
        raise TransactionalError(f"topology {topology_id!r} has no Spark application recorded (it was not "
                                 "declared with transactional_dag): nothing to recompute it with")
    bad = [c for c in conf if "=" not in c]
    if bad:
        raise TransactionalError(f"--conf takes key=value, got {bad[0]!r} (e.g. --conf spark.executor.memory=4g)")
    if remote and conf:
        raise TransactionalError("--conf sets a spark-submit driver's Spark; a Spark Connect server has its own "
                                 "settings: set them where the server starts, or drop --spark-connect")
    with tempfile.TemporaryDirectory(prefix=f"txn-{mode}-") as tmp:
        result_file = os.path.join(tmp, "result.json")
        app = [job.application, *job.application_args, "--topology", topology_id, "--schema", schema, f"--{mode}",
               *filter(None, [mode_value]), "--result-file", result_file]
        if remote:
            env = connect_client_env(remote, dsn, spec.source, job.py_files, os.environ)
            proc = subprocess.run([sys.executable, *app], env=env, capture_output=True, text=True, check=False)
        else:
            proc = _submitted(dsn, spec, master, conf, records, job.py_files, app)
        if not os.path.exists(result_file):  # what it said, wherever it said it
            said = "\n".join(filter(None, (proc.stderr[-4000:].strip(), proc.stdout[-2000:].strip())))
            raise TransactionalError(f"the {mode} job failed ({proc.returncode}):\n{redact(said)}")
        with open(result_file, encoding="utf-8") as fh:
            return dict(json.load(fh))


def _submitted(dsn: str, spec: TopologySpec, master: str, conf: list[str], records: int | None,
               job_py_files: str | None, app: list[str]) -> subprocess.CompletedProcess[str]:
    """``app`` (the job and its arguments) run under ``spark-submit`` on ``master``, the job's own
    modules (``job_py_files``) beside the provider's."""
    settings = with_quiet_driver_logs({"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "8",
                                       **dict(c.split("=", 1) for c in conf)})
    if records is not None and master.startswith("local"):
        settings = with_jit_for_batch(settings, {}, records)
    settings = cds.with_archive(settings, cds.current())
    # A driver here: the DSN (and the source's connection) in a private file, never argv.
    delivery = deliver_dsn(dsn, master, None, connections=connections_for(spec.source))
    argv = spark_submit_argv(master, settings)
    connector = jars_for(spec.source, settings)
    argv += ["--jars", ",".join(connector)] if connector else []
    py_files = ",".join(filter(None, [provider_zip(), job_py_files]))
    argv += ["--py-files", py_files, *app, *delivery.app_args]
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    env.pop(DSN_ENV, None)
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    finally:
        delivery.remove()


def connect_client_env(url: str, dsn: str, source: Source | None, py_files: str | None,
                       base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a job run as a Spark Connect client of ``url`` on this machine: the URL
    (it may hold a token) and the DSN (with the source's connection) in the environment only, never
    argv; the import path spark-submit's ``--py-files`` would give its driver."""
    env = {**base, REMOTE_ENV: url, DSN_ENV: secrets_text(dsn, connections_for(source) if source else None),
           "PYSPARK_PYTHON": base.get("PYSPARK_PYTHON", sys.executable)}
    path = client_path(py_files)
    if path:
        env["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [env.get("PYTHONPATH")])])
    return env


def client_path(py_files: str | None) -> list[str]:
    """The import path a job's ``py_files`` give a Spark Connect client on this machine: the folder
    of each ``.py`` file, each archive itself (URLs are the server's business)."""
    out: list[str] = []
    for item in filter(None, (p.strip() for p in (py_files or "").split(","))):
        if "://" in item:
            continue
        entry = os.path.dirname(item) if item.endswith(".py") else item
        if entry not in out:
            out.append(entry)
    return out
