"""The job entry point (:func:`run`) and its two modes: process one txid; or recompute committed
txids, as a request asks (``--recompute``: an audit, a rebuild, a preview, a verify round --
``spark/recompute.py``).

A job author writes ``transform(records) -> {state: DataFrame}``; a job file in ``spark_jobs/`` is::

    from airflow_transactional.spark_job import run

    def transform(events):                      # events: one row per good source record
        return {"url_counts": events.select("url", F.lit(1).alias("value"))}

    if __name__ == "__main__":
        run(transform, schema="url string, user string", required=["url"])

``run`` does the rest, with the same rules as the pure-Python :mod:`processing`:

* reads the planned batch of ``--txid``, never more or less than the plan: landing files with
  Spark's own readers; Postgres log ranges spooled by the driver as CSV files for the JVM's
  reader where the executors see them (a local master, or ``spark.airflow_transactional.logSpoolDir``),
  else in parallel chunks on the executors;
* parses and validates records: malformed payloads and records missing a ``required`` field
  go to the quarantine with their offset and the reason (or fail the attempt when the topology
  says ``on_bad_record="fail"``);
* folds each state's rows per key with the state's combiner and COPYs the partials into the
  staging table of (txid, attempt) -- from the driver when they are small, else from the
  executors. States declared per record (``per_record(events, {"url": F.col("url")})``) are
  all folded in one pass over the batch, which is never cached; a state given as any other
  DataFrame gets a job of its own over the cached batch;
* records the attempt complete with its row counts -- or failed, so it is never committed.

``--recompute REQUEST`` runs a kind of the recompute engine on the request's file (JSON, which
``airflow-txn audit|rebuild|correct|verify`` and the verify task write): e.g. an audit recomputes
every state from the source over the committed offsets in one pass and diffs it against the state
tables; a verify round checks up to N committed txids (1 in K sampled) against their commits.

The DSN comes from a file named by ``--dsn-file`` (or ``$AIRFLOW_TXN_DSN_FILE``, or
``$AIRFLOW_TXN_DSN``), never from argv, which ``ps`` and logs show (see :mod:`.submit`).

With ``$SPARK_REMOTE`` set (``sc://host:port``) the job is a Spark Connect client of a
long-lived Spark instead of a ``spark-submit`` driver: the same file runs under plain
``python``, a batch pays no JVM start-up, and the executor-side steps (reading log chunks,
COPYing partials) run as Arrow batches (``mapInArrow``) since Connect has no RDDs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import faults, provenance
from ..connections import Connections, redact
from ..coordinator import Coordinator
from ..exceptions import BadRecord, ConfigError, StaleAttempt, TransactionalError
from ..model import DEFAULT_SCHEMA, OutputStaging, Staging, read_digest
from ..spec import TopologySpec
from .admit import SetAside
from .batch import Read, Transform, folded, read_batch
from .handoff import REMOTE_ENV
from .profile import Phases
from .read import readable_batch
from .recompute import RECOMPUTE_ARG, read_request
from .recompute import run as recompute
from .stage import copy_dataframe, decision_requests, output_events, stage_fold
from .submit import DSN_FILE_ARG, driver_secrets, provider_zip
from .watch import watched

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="process one planned transaction of a topology")
    p.add_argument("--topology", required=True)
    p.add_argument("--txid", type=int, help="the transaction to process")
    p.add_argument("--dag-version", help="the Airflow DAG version of the run's try (recorded with the attempt)")
    p.add_argument("--schema", default=DEFAULT_SCHEMA, help="the provider's schema in the store")
    p.add_argument(RECOMPUTE_ARG, metavar="REQUEST", help="recompute committed txids as the request's file asks "
                   "(airflow-txn and the verify task write one)")
    p.add_argument("--result-file", help="write a JSON summary here")
    p.add_argument(DSN_FILE_ARG, help="a file holding the state store's DSN (else $AIRFLOW_TXN_DSN_FILE, "
                   "$AIRFLOW_TXN_DSN)")
    args, _unknown = p.parse_known_args(argv)
    if args.recompute is None and args.txid is None:
        p.error(f"--txid is required (or {RECOMPUTE_ARG})")
    return args


def _session(app_name: str) -> SparkSession:
    from pyspark.sql import SparkSession

    remote = os.environ.get(REMOTE_ENV)
    if remote:
        spark = SparkSession.builder.remote(remote).getOrCreate()
        # The executors of a remote Spark may not have the provider installed: ship it.
        spark.addArtifacts(provider_zip(), pyfile=True)
        log.info("%s: a Spark Connect session", app_name)
        return spark
    spark = SparkSession.builder.appName(app_name).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def process(spark: SparkSession, coordinator: Coordinator, topology_id: str, txid: int, transform: Transform,
            *, schema: str | None, required: Sequence[str], checks: Mapping[str, str] | None = None,
            phases: Phases | None = None, dag_version: str | None = None) -> dict[str, Any]:
    """Process ``txid`` once, as a new attempt (see the module docstring); ``dag_version``: the
    Airflow DAG version of the run's try, recorded with the attempt and its code's digests."""
    phases = phases or Phases()
    faults.point("spark.start", scope=(topology_id, str(txid)))  # a driver that dies before it registers
    txn = coordinator.transaction(topology_id, txid)
    if txn.committed:
        return {"txid": txid, "skipped": f"txid {txid} already committed at {txn.committed_at}; nothing to do"}
    if txn.empty:
        return {"txid": txid, "skipped": f"txid {txid} is empty; nothing to process"}
    spec = coordinator.spec(topology_id)
    dsn = coordinator.dsn
    scope = (topology_id, str(txid))
    cached: DataFrame | None = None
    try:
        with coordinator.processing(topology_id, txid, application=provenance.application_digest(transform),
                                    dag_version=dag_version) as work:
            attempt = work.attempt
            faults.point("spark.begin", scope=scope)
            batch, unreadable = readable_batch(work.txn.batch, spec.source)
            read = read_batch(spark, coordinator, spec, batch, transform, schema=schema, required=required,
                              checks=checks)
            cached = read.keep
            phases.lap("read, parse, validate, fold" if read.folds else "read, parse, validate, cache")
            records_read = read.records + len(unreadable)
            n_bad = read.bad_records + len(unreadable)
            if n_bad and spec.on_bad_record == "fail":
                offset, why = unreadable[0] if unreadable else tuple(
                    read.prepared.bad.select("offset", "reason").first() or ("?", "?"))
                raise BadRecord(f"txid {txid}: {n_bad} bad records, first at offset {offset}: {why} "
                                "(on_bad_record='fail'; use 'quarantine' to set them aside)")
            set_aside = SetAside(Staging(coordinator.quarantine_copy(), (topology_id, txid, attempt.attempt)))
            counts = _stage(coordinator, spec, read, (txid, attempt.attempt), set_aside, phases)
            faults.point("spark.after_stage", scope=scope)
            n_bad += _quarantine(spark, dsn, spec, read, set_aside, txid, phases)
            work.finish(counts, records_read=records_read, quarantined=n_bad,
                        bad=[(path, None, why, None) for path, why in unreadable],
                        read_digest=read_digest(read.records, read.prepared.offset_crcs()))
            phases.lap("finish the attempt")
    finally:
        if cached is not None:
            try:
                cached.unpersist()
            except Exception as exc:  # a dead session must not hide the attempt's own outcome
                log.warning("could not drop the cached batch of txid %d: %s", txid, exc)
    return {"txid": txid, "attempt": attempt.attempt, "records_read": records_read, "row_counts": counts,
            "quarantined": n_bad}


def _stage(coordinator: Coordinator, spec: TopologySpec, read: Read, key: tuple[int, int], set_aside: SetAside,
           phases: Phases) -> dict[str, int]:
    """Stage what the attempt ``key`` (txid, attempt) folded, requested and emitted; rows by name."""
    topology_id = spec.topology_id
    dsn = coordinator.dsn
    copies = coordinator.staging_copies(topology_id)
    # Outputs and decisions only: a plain topology's batch makes no extra round trip.
    out = (coordinator.output_staging(topology_id) if spec.outputs or spec.decisions
           else OutputStaging("", {}, {}))
    counts = {name: 0 for name in (*out.partitions, *out.requests)}
    if read.folds is not None:
        counts.update(read.folds.stage(dsn, copies, key, set_aside))
        phases.lap("stage the folds")
    else:
        for name, df in folded(spec, read.frames).items():
            if name in copies:
                counts[name] = stage_fold(df, dsn, Staging(copies[name], key), set_aside=set_aside,
                                          label=f"fold:{name}")
                phases.lap(f"fold and stage {name}")
            elif name in out.requests:
                requests = decision_requests(name, spec.state(spec.decision(name).state), df)
                counts[name] = stage_fold(requests, dsn, Staging(out.requests[name], key),
                                          set_aside=set_aside, label=f"request:{name}")
                phases.lap(f"stage requests {name}")
            else:
                events = output_events(topology_id, name, out.partitions[name], df,
                                       [d.name for d in spec.decisions], txid=key[0])
                counts[name] = stage_fold(events, dsn, Staging(out.copy, (*key, name)),
                                          set_aside=set_aside, label=f"output:{name}")
                phases.lap(f"stage output {name}")
    return counts


def _quarantine(spark: SparkSession, dsn: str, spec: TopologySpec, read: Read, set_aside: SetAside, txid: int,
                phases: Phases) -> int:
    """Quarantine the attempt's bad records and the records no state could fold; how many."""
    # Streamed from the executors, never collected: a batch of garbage fits no driver. (After a
    # fused fold the batch is read again for its bad records: only a batch that has some.)
    if read.bad_records:
        copy_dataframe(spark, read.prepared.bad, dsn, set_aside.target, slice_of=set_aside.next_slice())
        phases.lap("quarantine")
    rejected = read.folds.rejected_count if read.folds is not None else 0
    if rejected:
        assert read.folds is not None
        copy_dataframe(spark, read.folds.rejected, dsn, set_aside.target, slice_of=set_aside.next_slice())
        phases.lap("quarantine records no state could fold")
    if (rejected or set_aside.rows) and spec.on_bad_record == "fail":
        raise BadRecord(f"txid {txid}: {rejected + set_aside.rows} records or folded rows could not be staged "
                        "(see the attempt's quarantine) (on_bad_record='fail'; use 'quarantine' to set them "
                        "aside)")
    return rejected + set_aside.rows


def run(transform: Transform, *, schema: str | None = None, required: Sequence[str] = (),
        checks: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> int:
    """Entry point of a job file: parse argv, process one transaction (or audit), exit.

    A record is quarantined when it does not parse under ``schema``, lacks a ``required`` field,
    or fails one of ``checks`` -- ``{reason: Spark SQL condition it must meet}``, e.g.
    ``{"amount must be positive": "amount > 0"}`` (a condition that is null fails).
    """
    phases = Phases()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    dsn, connections = driver_secrets(args.dsn_file)
    coordinator = Coordinator(dsn, schema=args.schema, connections=Connections(known=connections))
    spark = _session(f"txn:{args.topology}:{'recompute' if args.recompute else args.txid}")
    phases.lap("session")
    try:
        with watched(spark):  # a standalone cluster's driver left without executors fails, to be retried
            if args.recompute:
                kind = read_request(args.recompute)
                if kind.topology_id != args.topology:
                    raise ConfigError(f"the recompute request is for {kind.topology_id!r}, not --topology "
                                      f"{args.topology!r}")
                result = recompute(kind, spark, coordinator, transform, schema=schema, required=required,
                                   checks=checks, phases=phases)
            else:
                result = process(spark, coordinator, args.topology, args.txid, transform, schema=schema,
                                 required=required, checks=checks, phases=phases, dag_version=args.dag_version)
        phases.threads()
    except StaleAttempt as exc:
        log.warning("%s", exc)
        result = {"txid": args.txid, "stale": str(exc)}
        _write_result(args.result_file, result)
        return 3
    except TransactionalError as exc:
        log.error("%s", redact(str(exc)))
        raise
    finally:
        coordinator.close()
        spark.stop()
    phases.lap("stop")
    result["profile"] = phases.summary()
    log.info("result: %s", json.dumps(result, default=str))
    _write_result(args.result_file, result)
    return 1 if result.get("auditable") and result.get("differences") else 0


def _write_result(path: str | None, result: Mapping[str, Any]) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(result, fh, default=str)
