"""The recompute engine (``core/recompute.py``) on Spark, both ends of it.

In the job: ``--recompute REQUEST`` -- one mode, its request a file of JSON naming a kind of the
engine and its fields (``core/recompute.request``; :func:`deliver_request` writes it,
:func:`read_request` reads it back): an audit (every state over the committed offsets, diffed
against the tables), a rebuild (the same, swapped in while the topology keeps committing), a
preview (txids A..B under the code deployed now: what a correction of them would change, and
whether the same code computes the same -- its determinism) or a verify round (the shadow audit),
run through the coordinator's ``recompute``. What is Spark's is only :func:`spark_fold`, the
engine's one operation: a planned batch read, parsed, validated and folded by the job's
transform, and staged by the executors.

From ``airflow-txn`` (the owner's recomputations, :func:`recompute`) and the verify task: the
topology's own job with a request -- under ``spark-submit``, or as a client of a Spark Connect
server (a process of this machine, as the process task runs it) -- its summary read back."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import provenance
from ..connections import redact
from ..coordinator import (
    Coordinator,
    CorrectionPreview,
    Fold,
    Folded,
    Kind,
    Target,
    VerificationRound,
    from_request,
    request,
)
from ..exceptions import ConfigError, TransactionalError
from ..model import PlannedBatch, Staging, read_digest
from ..sources import Source
from ..sources.base import connections_for
from ..spec import TopologySpec
from . import cds
from .admit import SetAside
from .batch import Read, Transform, read_batch, stage_states
from .handoff import REMOTE_ENV
from .jars import jars_for
from .profile import Phases
from .read import readable_batch
from .stage import output_events, stage_fold
from .submit import (
    DSN_ENV,
    DsnDelivery,
    deliver_dsn,
    lowest_priority,
    provider_zip,
    secrets_text,
    spark_submit_argv,
    with_jit_for_batch,
    with_quiet_driver_logs,
    write_dsn_file,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


#: The job's one recompute mode; its value, the request's file.
RECOMPUTE_ARG = "--recompute"
#: The name a cluster-mode driver's shipped request file takes beside it (YARN's ``#name``).
SHIPPED_REQUEST = "airflow_txn_recompute.json"


def deliver_request(kind: Kind, deploy_mode: str | None = None) -> DsnDelivery:
    """The request for ``kind`` in a new private file, and how it reaches the job: its path (a driver
    or a Spark Connect client on this machine), or shipped beside a cluster-mode driver (``--files``)."""
    path = write_dsn_file(json.dumps(request(kind)), prefix="request-")
    if deploy_mode == "cluster":
        return DsnDelivery([RECOMPUTE_ARG, SHIPPED_REQUEST], [f"{path}#{SHIPPED_REQUEST}"], local_file=path)
    return DsnDelivery([RECOMPUTE_ARG, str(path)], local_file=path)


def read_request(given: str) -> Kind:
    """The kind the job's request file asks for: at ``given``, else among the files Spark shipped it."""
    path = given
    if not os.path.exists(path):
        from pyspark import SparkFiles

        path = SparkFiles.get(os.path.basename(given))
    try:
        with open(path, encoding="utf-8") as fh:
            given_request = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{RECOMPUTE_ARG} takes the file of a recompute request (airflow-txn and the verify task "
                          f"write one), and {given} is none: {exc}") from None
    return from_request(given_request)  # a request of no kind, or a kind's bad field: said as it is


def recompute(dsn: str, schema: str, spec: TopologySpec, kind: Kind, *, master: str, conf: list[str],
              records: int | None = None, remote: str | None = None) -> dict[str, Any]:
    """Run ``spec``'s Spark job on the request ``kind`` on ``master`` -- or, given ``remote`` (a Spark
    Connect URL, which may hold a token), as a client of that server; its summary.
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
    asked = deliver_request(kind)
    with tempfile.TemporaryDirectory(prefix=f"txn-{kind.name}-") as tmp:
        result_file = os.path.join(tmp, "result.json")
        app = [job.application, *job.application_args, "--topology", topology_id, "--schema", schema,
               *asked.app_args, "--result-file", result_file]
        try:
            if remote:
                env = connect_client_env(remote, dsn, spec.source, job.py_files, os.environ)
                proc = subprocess.run([sys.executable, *app], env=env, capture_output=True, text=True, check=False)
            else:
                # A state build runs beside the live topology for as long as its history takes: on
                # this machine its driver (and a local master's executors) take what the batches leave.
                proc = _submitted(dsn, spec, master, conf, records, job.py_files, app,
                                  niced=kind.name == "build" and master.startswith("local"))
        finally:
            asked.remove()
        if not os.path.exists(result_file):  # what it said, wherever it said it
            said = "\n".join(filter(None, (proc.stderr[-4000:].strip(), proc.stdout[-2000:].strip())))
            raise TransactionalError(f"the {kind.name} job failed ({proc.returncode}):\n{redact(said)}")
        with open(result_file, encoding="utf-8") as fh:
            return dict(json.load(fh))


def _submitted(dsn: str, spec: TopologySpec, master: str, conf: list[str], records: int | None,
               job_py_files: str | None, app: list[str], *, niced: bool = False) -> subprocess.CompletedProcess[str]:
    """``app`` (the job and its arguments) run under ``spark-submit`` on ``master``, the job's own
    modules (``job_py_files``) beside the provider's; ``niced``: at the lowest CPU priority."""
    settings = with_quiet_driver_logs({"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "8",
                                       **dict(c.split("=", 1) for c in conf)})
    if records is not None and master.startswith("local"):
        settings = with_jit_for_batch(settings, {}, records)
    startup = cds.current()
    settings = cds.with_archive(settings, startup)
    # A driver here: the DSN (and the source's connection) in a private file, never argv.
    delivery = deliver_dsn(dsn, master, None, connections=connections_for(spec.source))
    argv = spark_submit_argv(master, settings)
    connector = jars_for(spec.source, settings)
    argv += ["--jars", ",".join(connector)] if connector else []
    py_files = ",".join(filter(None, [provider_zip(), job_py_files]))
    argv += ["--py-files", py_files, *app, *delivery.app_args]
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable), **cds.env_of(startup)}
    env.pop(DSN_ENV, None)
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=False,
                              preexec_fn=lowest_priority if niced else None)
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


# -- in the job: the engine's fold on Spark, and each kind run with it ------------------------------

def spark_fold(spark: SparkSession, coordinator: Coordinator, spec: TopologySpec, transform: Transform, *,
               schema: str | None, required: Sequence[str], checks: Mapping[str, str] | None,
               phases: Phases | None = None) -> Fold:
    """The engine's fold on Spark: the batch read (less its unreadable files, counted as set aside)
    and folded by ``transform`` as the process task does, its states -- and its output events, when
    the target asks for them -- staged by the executors."""
    def fold(batch: PlannedBatch, target: Target) -> Folded:
        batch, unreadable = readable_batch(batch, spec.source)
        # As it is now: a state build's begins after this fold was made.
        now = coordinator.spec(spec.topology_id)
        read = read_batch(spark, coordinator, now, batch, transform, schema=schema, required=required,
                          checks=checks, states=list(target.states) if target.events is None else None)
        if phases is not None:
            phases.lap("read, parse, validate, fold")
        set_aside = 0
        if target.events is not None:
            read, set_aside = _stage_events(coordinator, now, read, target.events)
        set_aside += stage_states(now, read, coordinator.dsn, target.states, target.prefix)
        read.keep.unpersist()
        if phases is not None:
            phases.lap("stage")
        return Folded(read.bad_records + len(unreadable) + set_aside,
                      read_digest(read.records, read.prepared.offset_crcs()))

    return fold


def run(kind: Kind, spark: SparkSession, coordinator: Coordinator, transform: Transform, *, schema: str | None,
        required: Sequence[str], checks: Mapping[str, str] | None = None, phases: Phases | None = None
        ) -> dict[str, Any]:
    """Run the recomputation ``kind`` with the job's transform (a kind that records the code it
    recomputes with -- a preview, a verify round -- records the declaration and this transform)."""
    spec = coordinator.spec(kind.topology_id)
    if isinstance(kind, CorrectionPreview | VerificationRound):
        code = provenance.code(spec.to_config(), application=provenance.application_digest(transform))
        kind = dataclasses.replace(kind, code=code)
    fold = spark_fold(spark, coordinator, spec, transform, schema=schema, required=required, checks=checks,
                      phases=phases)
    return coordinator.recompute(kind, fold, phases.lap if phases is not None else None)


def _stage_events(coordinator: Coordinator, spec: TopologySpec, read: Read, target: Staging) -> tuple[Read, int]:
    """Stage the output events ``read`` holds into ``target`` (its prefix: txid, attempt), as the
    process task stages them; the read without them (its states), and the rows set aside."""
    set_aside = SetAside(Staging(""))
    partitions = coordinator.output_staging(spec.topology_id).partitions
    for o in spec.outputs:
        events = output_events(spec.topology_id, o.name, partitions[o.name], read.frames[o.name],
                               [d.name for d in spec.decisions], txid=target.prefix[0])
        stage_fold(events, coordinator.dsn, Staging(target.copy, (*target.prefix, o.name)), set_aside=set_aside)
    return read._replace(frames={s.name: read.frames[s.name] for s in spec.recomputable_states}), set_aside.rows
