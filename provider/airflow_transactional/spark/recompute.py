"""The owner's recomputations, ``airflow-txn audit`` and ``rebuild``: the topology's own Spark job
under ``spark-submit`` in its ``--audit`` or ``--rebuild`` mode, its summary read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from ..connections import redact
from ..exceptions import TransactionalError
from ..sources.base import connections_for
from ..spec import TopologySpec
from . import cds
from .jars import jars_for
from .submit import deliver_dsn, provider_zip, spark_submit_argv, with_jit_for_batch, with_quiet_driver_logs


def recompute(dsn: str, schema: str, spec: TopologySpec, mode: str, *, master: str, conf: list[str],
              records: int | None = None, mode_value: str | None = None) -> dict[str, Any]:
    """Run ``spec``'s Spark job in ``mode`` (``audit``, ``rebuild``, or ``preview`` of the txids
    ``mode_value`` names) on ``master``; its summary.
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
    with tempfile.TemporaryDirectory(prefix=f"txn-{mode}-") as tmp:
        result_file = os.path.join(tmp, "result.json")
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
        py_files = ",".join(filter(None, [provider_zip(), job.py_files]))  # the job's own modules too
        argv += ["--py-files", py_files, job.application, *job.application_args,
                 "--topology", topology_id, "--schema", schema, f"--{mode}", *filter(None, [mode_value]),
                 "--result-file", result_file,
                 *delivery.app_args]
        env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        env.pop("AIRFLOW_TXN_DSN", None)
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        finally:
            delivery.remove()
        if not os.path.exists(result_file):  # what it said, wherever it said it
            said = "\n".join(filter(None, (proc.stderr[-4000:].strip(), proc.stdout[-2000:].strip())))
            raise TransactionalError(f"the {mode} job failed ({proc.returncode}):\n{redact(said)}")
        with open(result_file, encoding="utf-8") as fh:
            return dict(json.load(fh))
