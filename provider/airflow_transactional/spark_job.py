"""The Spark side of a topology: a job author writes ``transform(records) -> {state: DataFrame}``.

A job file in ``spark_jobs/`` is::

    from airflow_transactional.spark_job import run

    def transform(events):                      # events: one row per good source record
        return {"url_counts": events.select("url", F.lit(1).alias("value"))}

    if __name__ == "__main__":
        run(transform, schema="url string, user string", required=["url"])

``run`` does the rest, with the same rules as the pure-Python :mod:`processing`:

* reads the planned batch of ``--txid`` on the executors (Postgres log ranges in parallel
  chunks; landing files with Spark's own readers), never more or less than the plan;
* parses and validates records: malformed payloads and records missing a ``required`` field
  go to the quarantine with their offset and the reason (or fail the attempt when the topology
  says ``on_bad_record="fail"``);
* folds each state's rows per key with the state's combiner and COPYs the partials into the
  staging table of (txid, attempt) straight from the executors;
* records the attempt complete with its row counts -- or failed, so it is never committed.

``--audit`` recomputes every state from the source over the committed offsets in one pass and
diffs it against the state tables (``airflow-txn audit`` runs it).

The DSN comes from a file named by ``--dsn-file`` (or ``$AIRFLOW_TXN_DSN_FILE``, or
``$AIRFLOW_TXN_DSN``), never from argv, which ``ps`` and logs show (see :mod:`submit`).

With ``$SPARK_REMOTE`` set (``sc://host:port``) the job is a Spark Connect client of a
long-lived Spark instead of a ``spark-submit`` driver: the same file runs under plain
``python``, a batch pays no JVM start-up, and the executor-side steps (reading log chunks,
COPYing partials) run as Arrow batches (``mapInArrow``) since Connect has no RDDs.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import faults
from .coordinator import QUARANTINE_RECORD_CHARS, Coordinator
from .exceptions import BadRecord, ConfigError, StaleAttempt, TransactionalError
from .sources import LandingDirectory, PostgresLogSource, Source, source_from_config
from .spec import StateSpec, TopologySpec
from .store.connection import redact
from .store.migrations import DEFAULT_SCHEMA
from .submit import DSN_FILE_ARG, driver_dsn, provider_zip, quiet_log_config, with_quiet_driver_logs
from .values import Combiner

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# provider_zip and the quiet driver logs moved to .submit; importing them from here still works.
__all__ = ["audit", "fold", "process", "provider_zip", "quiet_log_config", "rebuild", "run", "validate",
           "with_quiet_driver_logs"]

log = logging.getLogger("airflow_transactional.spark_job")

REMOTE_ENV = "SPARK_REMOTE"
Transform = Callable[["DataFrame"], Mapping[str, "DataFrame"]]

# Columns the helper adds to every good record: where it came from.
OFFSET_COL, EVENT_ID_COL = "_offset", "_event_id"
_CORRUPT = "_corrupt_record"
LOG_CHUNK = 50_000  # LSNs per Spark task when reading a Postgres log range


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="process one planned transaction of a topology")
    p.add_argument("--topology", required=True)
    p.add_argument("--txid", type=int, help="the transaction to process")
    p.add_argument("--schema", default=DEFAULT_SCHEMA, help="the provider's schema in the store")
    p.add_argument("--audit", action="store_true", help="recompute the committed state and diff it")
    p.add_argument("--rebuild", action="store_true", help="recompute the state and swap it in")
    p.add_argument("--result-file", help="write a JSON summary here")
    p.add_argument(DSN_FILE_ARG, help="a file holding the state store's DSN (else $AIRFLOW_TXN_DSN_FILE, "
                   "$AIRFLOW_TXN_DSN)")
    args, _unknown = p.parse_known_args(argv)
    if not (args.audit or args.rebuild) and args.txid is None:
        p.error("--txid is required (or --audit, --rebuild)")
    return args


# -- reading a batch -------------------------------------------------------------------------

def _log_chunks(batch: Mapping[str, Any], size: int = LOG_CHUNK) -> list[tuple[int, int, int]]:
    chunks = []
    for p, lo, hi in batch.get("ranges", []):
        for start in range(int(lo), int(hi), size):
            chunks.append((int(p), start, min(start + size, int(hi))))
    return chunks


def _read_log_chunks(dsn: str, schema: str, topology_id: str, source_cfg: dict[str, Any],
                     chunks: Iterable[tuple[int, int, int]]) -> Iterator[tuple[str, str | None, str]]:
    """Executor side: stream the events of some LSN chunks (the source's own read)."""
    import psycopg2

    source = source_from_config(source_cfg)
    conn = psycopg2.connect(dsn, application_name="airflow_transactional:spark_read")
    try:
        with conn, conn.cursor() as cur:
            for p, lo, hi in chunks:
                for rec in source.read(cur, schema, topology_id, {"ranges": [[p, lo, hi]]}):
                    yield rec.offset, rec.event_id, rec.payload
    finally:
        conn.close()


def _rows(batches: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """The rows of Arrow record batches, as tuples."""
    for batch in batches:
        yield from zip(*(col.to_pylist() for col in batch.columns), strict=True)


def _arrow_log_chunks(dsn: str, schema: str, topology_id: str, source_cfg: dict[str, Any],
                      batches: Iterable[Any], size: int = 10_000) -> Iterator[Any]:
    """Executor side, Connect: :func:`_read_log_chunks` over Arrow batches of (p, lo, hi)."""
    import pyarrow as pa

    names = [OFFSET_COL, EVENT_ID_COL, "payload"]
    out: list[tuple[str, str | None, str]] = []
    for rec in _read_log_chunks(dsn, schema, topology_id, source_cfg, _rows(batches)):
        out.append(rec)
        if len(out) >= size:
            yield pa.RecordBatch.from_arrays([pa.array(c, pa.string()) for c in zip(*out, strict=True)], names)
            out = []
    if out:
        yield pa.RecordBatch.from_arrays([pa.array(c, pa.string()) for c in zip(*out, strict=True)], names)


def is_remote(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def raw_records(spark: SparkSession, source: Source, batch: Mapping[str, Any], *, dsn: str, schema: str,
                topology_id: str) -> tuple[DataFrame, bool]:
    """The batch as a DataFrame and whether it holds raw text payloads (to be parsed).

    Text sources give ``(_offset, _event_id, payload)``; Parquet gives its own columns plus
    ``_offset``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    raw_schema = StructType([StructField(OFFSET_COL, StringType()), StructField(EVENT_ID_COL, StringType()),
                             StructField("payload", StringType())])
    if isinstance(source, PostgresLogSource):
        chunks = _log_chunks(batch)
        if not chunks:
            return spark.createDataFrame([], raw_schema), True
        cfg = source.to_config()
        if is_remote(spark):
            ranges = spark.createDataFrame(chunks, "p long, lo long, hi long").repartition(min(len(chunks), 8))
            return ranges.mapInArrow(lambda batches: _arrow_log_chunks(dsn, schema, topology_id, cfg, batches),
                                     raw_schema), True
        n = max(1, min(len(chunks), spark.sparkContext.defaultParallelism * 4))
        rdd = spark.sparkContext.parallelize(chunks, n).mapPartitions(
            lambda it: _read_log_chunks(dsn, schema, topology_id, cfg, it))
        return spark.createDataFrame(rdd, raw_schema), True
    if isinstance(source, LandingDirectory):
        files = [f["path"] for f in batch.get("files", [])]
        if not files:
            return spark.createDataFrame([], raw_schema), True
        if batch.get("format", "json") == "parquet":
            df = spark.read.parquet(*files)
            return df.withColumn(OFFSET_COL, F.input_file_name()), False
        if batch.get("format") == "csv":
            df = spark.read.option("header", True).csv(*files)
            return df.withColumn(OFFSET_COL, F.input_file_name()), False
        df = spark.read.text(files).where(F.trim("value") != "")
        return df.select(F.input_file_name().alias(OFFSET_COL), F.lit(None).cast("string").alias(EVENT_ID_COL),
                         F.col("value").alias("payload")), True
    raise ConfigError(f"the Spark helper cannot read sources of kind {source.kind!r}")


def validate(df: DataFrame, is_text: bool, schema: str | None,
             required: Sequence[str]) -> tuple[DataFrame, DataFrame, int, DataFrame]:
    """Split records into (good, bad, how many records, the cached batch): good has the parsed
    fields, bad has offset/reason/record. The caller unpersists the cached batch when done (a
    Spark Connect server outlives the job and would keep it).

    Records are parsed once: the parsed batch is cached (memory, then disk) for the passes that
    follow -- the quarantine and one fold per state -- and holds the raw record only for bad
    ones. (Caching the raw text instead re-parsed every JSON payload in every pass.)
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    if is_text:
        if not schema:
            raise ConfigError("text sources need a record schema: run(transform, schema='field type, ...')")
        parsed_schema = StructType([*spark_schema(schema).fields, StructField(_CORRUPT, StringType())])
        parsed = df.withColumn("_r", F.from_json("payload", parsed_schema,
                                                 {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}))
        fields = [f.name for f in parsed_schema.fields if f.name != _CORRUPT]
        # A payload that is not a JSON object (or not JSON at all) parses to nothing at all.
        malformed = F.col(f"_r.{_CORRUPT}").isNotNull() | F.col("_r").isNull()
        flat = parsed.select(OFFSET_COL, EVENT_ID_COL, "payload", *[F.col(f"_r.{f}").alias(f) for f in fields],
                             malformed.alias("_malformed"))
        record = F.col("payload")
    else:
        fields = [c for c in df.columns if c not in (OFFSET_COL,)]
        flat = df.withColumn(EVENT_ID_COL, F.lit(None).cast("string")).withColumn("_malformed", F.lit(False))
        record = F.to_json(F.struct(*[F.col(c) for c in fields]))
    unknown = [r for r in required if r not in fields]
    if unknown:
        raise ConfigError(f"required fields {unknown} are not in the record schema ({', '.join(fields)})")
    reason = F.when(F.col("_malformed"), F.lit("malformed record: not a JSON object of the schema"))
    for r in required:
        reason = reason.when(F.col(r).isNull(), F.lit(f"missing required field {r!r}"))
    flat = flat.withColumn("_reason", reason)
    # Only a prefix of a bad record is kept (and its length): a poison record of any size costs
    # the quarantine QUARANTINE_RECORD_CHARS characters.
    is_bad = F.col("_reason").isNotNull()
    flat = (flat.withColumn("_record", F.when(is_bad, F.substring(record, 1, QUARANTINE_RECORD_CHARS)))
            .withColumn("_record_length", F.when(is_bad, F.length(record)))
            .select(OFFSET_COL, EVENT_ID_COL, *fields, "_reason", "_record", "_record_length")
            .persist(StorageLevel.MEMORY_AND_DISK))
    records = flat.count()
    good = flat.where(F.col("_reason").isNull()).select(OFFSET_COL, EVENT_ID_COL, *fields)
    bad = flat.where(is_bad).select(
        F.coalesce(F.col(OFFSET_COL), F.lit("?")).alias("offset"), F.col(EVENT_ID_COL).alias("event_id"),
        F.col("_reason").alias("reason"), F.col("_record").alias("record"),
        F.col("_record_length").alias("record_length"))
    return good, bad, records, flat


def readable_batch(batch: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The batch without its Parquet files whose footer cannot be read, and (path, why) of those.

    A corrupt file would otherwise fail every attempt and stop the topology; it is quarantined
    by name instead (or fails the attempt naming it, with ``on_bad_record="fail"``).
    """
    if batch.get("format") != "parquet":
        return dict(batch), []
    import pyarrow.parquet as pq

    unreadable = []
    for f in batch.get("files", []):
        try:
            pq.ParquetFile(f["path"]).metadata  # noqa: B018 -- reading the footer is the check
        except Exception as exc:
            unreadable.append((f["path"], f"unreadable Parquet file: {type(exc).__name__}: {exc}"[:1000]))
    gone = {p for p, _ in unreadable}
    return {**batch, "files": [f for f in batch.get("files", []) if f["path"] not in gone]}, unreadable


def spark_schema(ddl: str) -> Any:
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(ddl)
    if not isinstance(schema, StructType) or not schema.fields:
        raise ConfigError(f"record schema {ddl!r} has no fields")
    return schema


# -- folding and staging --------------------------------------------------------------------

def fold(state: StateSpec, df: DataFrame) -> DataFrame:
    """One row per key: the state's combiner over the rows the transform produced."""
    from pyspark.sql import functions as F

    keys = state.key_columns
    missing = [c for c in (*keys, "value") if c not in df.columns]
    if missing:
        raise ConfigError(f"the transform's DataFrame for state {state.name!r} lacks columns {missing}: "
                          f"it must have {', '.join(keys)} and value (has {', '.join(df.columns)})")
    combiner = Combiner(state.combiner)
    agg = {Combiner.SUM: F.sum, Combiner.COUNT: F.sum, Combiner.MIN: F.min, Combiner.MAX: F.max}.get(combiner)
    if agg is None:
        raise ConfigError(f"state {state.name!r}: the Spark helper folds sum, count, min and max; for "
                          "'replace' keep one row per key in the transform and use combiner 'max' on a "
                          "version column, or process with the pure-Python processor")
    null_key = " OR ".join(f"`{k}` IS NULL" for k in keys)
    return (df.select(*keys, "value").where(f"NOT ({null_key})")
            .groupBy(*keys).agg(agg("value").cast(_spark_type(state.value_type)).alias("value")))


def _spark_type(sql_type: str) -> str:
    return {"bigint": "bigint", "integer": "int", "numeric": "decimal(38,10)",
            "double precision": "double"}.get(sql_type, "string")


def _copy_field(value: Any) -> str:
    if value is None:
        return "\\N"
    return str(value).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def copy_partition(dsn: str, copy_sql: str, prefix: Sequence[Any], rows: Iterable[Any],
                   counter: Any = None) -> int:
    """Executor side: COPY one partition's rows into a table in one transaction; the count."""
    import psycopg2

    buf = io.StringIO()
    head = "".join(_copy_field(v) + "\t" for v in prefix)
    n = 0
    for row in rows:
        buf.write(head + "\t".join(_copy_field(v) for v in row) + "\n")
        n += 1
    if not n:
        return 0
    buf.seek(0)
    conn = psycopg2.connect(dsn, application_name="airflow_transactional:spark_stage")
    try:
        with conn, conn.cursor() as cur:
            cur.copy_expert(copy_sql, buf)
    finally:
        conn.close()
    if counter is not None:
        counter.add(n)
    return n


def _arrow_copy(dsn: str, copy_sql: str, prefix: Sequence[Any], batches: Iterable[Any]) -> Iterator[Any]:
    """Executor side, Connect: COPY one partition's Arrow batches; yield its row count."""
    import pyarrow as pa

    yield pa.RecordBatch.from_pydict({"n": [copy_partition(dsn, copy_sql, prefix, _rows(batches))]})


def copy_dataframe(spark: SparkSession, df: DataFrame, dsn: str, copy_sql: str, prefix: Sequence[Any]) -> int:
    """COPY a DataFrame from the executors, in parallel; return the rows written."""
    if is_remote(spark):
        from pyspark.sql import functions as F

        counts = df.mapInArrow(lambda batches: _arrow_copy(dsn, copy_sql, prefix, batches), "n long")
        return int(counts.agg(F.sum("n")).collect()[0][0] or 0)
    counter = spark.sparkContext.accumulator(0)

    def copy_each(rows: Iterable[Any]) -> None:
        copy_partition(dsn, copy_sql, prefix, rows, counter)

    df.foreachPartition(copy_each)
    return int(counter.value)


# -- the two modes ---------------------------------------------------------------------------

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


def _outputs(spec: TopologySpec, transform: Transform, good: DataFrame) -> dict[str, DataFrame]:
    out = transform(good)
    if not isinstance(out, Mapping):
        raise ConfigError("the transform must return {state name: DataFrame}")
    unknown = set(out) - {s.name for s in spec.states}
    if unknown:
        raise ConfigError(f"the transform returned unknown states {sorted(unknown)}; the topology has "
                          f"{', '.join(s.name for s in spec.states)}")
    missing = [s.name for s in spec.states if s.name not in out]
    if missing:
        raise ConfigError(f"the transform returned no DataFrame for states {missing}")
    return {s.name: fold(s, out[s.name]) for s in spec.states}


def process(spark: SparkSession, coordinator: Coordinator, topology_id: str, txid: int, transform: Transform,
            *, schema: str | None, required: Sequence[str]) -> dict[str, Any]:
    """Process ``txid`` once, as a new attempt (see the module docstring)."""
    txn = coordinator.transaction(topology_id, txid)
    if txn.committed:
        return {"txid": txid, "skipped": f"txid {txid} already committed at {txn.committed_at}; nothing to do"}
    if txn.empty:
        return {"txid": txid, "skipped": f"txid {txid} is empty; nothing to process"}
    spec = coordinator.spec(topology_id)
    attempt, txn = coordinator.begin_attempt(topology_id, txid)
    dsn = coordinator.db.dsn
    scope = (topology_id, str(txid))
    cached: DataFrame | None = None
    try:
        faults.point("spark.begin", scope=scope)
        batch, unreadable = readable_batch(txn.batch)
        raw, is_text = raw_records(spark, spec.source, batch, dsn=dsn, schema=coordinator.schema,
                                   topology_id=topology_id)
        good, bad, records_read, cached = validate(raw, is_text, schema, required)
        records_read += len(unreadable)
        n_bad = bad.count() + len(unreadable)  # over the cached batch: no second parse
        if n_bad and spec.on_bad_record == "fail":
            offset, why = unreadable[0] if unreadable else tuple(bad.select("offset", "reason").first() or ("?", "?"))
            raise BadRecord(f"txid {txid}: {n_bad} bad records, first at offset {offset}: {why} "
                            "(on_bad_record='fail'; use 'quarantine' to set them aside)")
        counts: dict[str, int] = {}
        copies = coordinator.staging_copies(topology_id)
        for name, delta in _outputs(spec, transform, good).items():
            counts[name] = copy_dataframe(spark, delta, dsn, copies[name], (txid, attempt.attempt))
        faults.point("spark.after_stage", scope=scope)
        coordinator.check_still_readable(topology_id, txn)
        # Streamed from the executors, never collected: a batch of garbage fits no driver.
        copy_dataframe(spark, bad, dsn, coordinator.quarantine_copy(), (topology_id, txid, attempt.attempt))
        coordinator.quarantine(attempt, [(path, None, why, None) for path, why in unreadable])
        coordinator.finish_attempt(attempt, counts, records_read=records_read, quarantined=n_bad)
    except BaseException as exc:
        coordinator.fail_attempt(attempt, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if cached is not None:
            try:
                cached.unpersist()
            except Exception as exc:  # a dead session must not hide the attempt's own outcome
                log.warning("could not drop the cached batch of txid %d: %s", txid, exc)
    return {"txid": txid, "attempt": attempt.attempt, "records_read": records_read, "row_counts": counts,
            "quarantined": n_bad}


def audit(spark: SparkSession, coordinator: Coordinator, topology_id: str, transform: Transform,
          *, schema: str | None, required: Sequence[str]) -> dict[str, Any]:
    """Recompute every state from the source over the committed offsets and diff the tables."""
    for _ in range(3):
        spec = coordinator.spec(topology_id)
        st = coordinator.status(topology_id)
        batch, why_not = coordinator.committed_batch(topology_id)
        if why_not:
            return {"topology": topology_id, "auditable": False, "reason": why_not, "differences": None}
        batch, unreadable = readable_batch(batch)
        raw, is_text = raw_records(spark, spec.source, batch, dsn=coordinator.db.dsn,
                                   schema=coordinator.schema, topology_id=topology_id)
        good, bad, _records, cached = validate(raw, is_text, schema, required)
        n_bad = bad.count() + len(unreadable)
        num, copies = coordinator.audit_tables(topology_id)
        for name, delta in _outputs(spec, transform, good).items():
            copy_dataframe(spark, delta, coordinator.db.dsn, copies[name], ())
        cached.unpersist()
        result = coordinator.diff_audit(topology_id, num, st.committed_txid)
        if result is None:  # a commit landed meanwhile: recompute against the new checkpoint
            continue
        result["quarantined_recomputed"] = n_bad
        result["quarantined_committed"] = st.quarantined
        if n_bad != st.quarantined:
            result["differences"] += abs(n_bad - st.quarantined)
            result["samples"].append(f"quarantine: {st.quarantined} committed, {n_bad} recomputed")
        return result
    raise TransactionalError(f"topology {topology_id!r} kept committing during the audit: pause it and rerun")


def rebuild(spark: SparkSession, coordinator: Coordinator, topology_id: str, transform: Transform,
            *, schema: str | None, required: Sequence[str]) -> dict[str, Any]:
    """Recompute every state from the source and swap it in while the topology keeps committing."""
    from . import rebuild as rb

    rebuild_ = rb.begin(coordinator, topology_id)
    try:
        spec = coordinator.spec(topology_id)
        batch, why_not = coordinator.committed_batch(topology_id, through_txid=rebuild_.through_txid)
        if why_not:
            raise TransactionalError(f"topology {topology_id!r} cannot be rebuilt from its source: {why_not}")
        raw, is_text = raw_records(spark, spec.source, readable_batch(batch)[0], dsn=coordinator.db.dsn,
                                   schema=coordinator.schema, topology_id=topology_id)
        good, _bad, _records, cached = validate(raw, is_text, schema, required)
        copies = rb.load_copies(coordinator, topology_id)
        for name, delta in _outputs(spec, transform, good).items():
            copy_dataframe(spark, delta, coordinator.db.dsn, copies[name], ())
        cached.unpersist()
        faults.point("rebuild.loaded", scope=(topology_id,))
        return rb.swap(coordinator, rebuild_)
    except BaseException:
        rb.abort(coordinator, topology_id, rebuild=rebuild_)
        raise


def run(transform: Transform, *, schema: str | None = None, required: Sequence[str] = (),
        argv: Sequence[str] | None = None) -> int:
    """Entry point of a job file: parse argv, process one transaction (or audit), exit."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    coordinator = Coordinator(driver_dsn(args.dsn_file), schema=args.schema)
    mode = "audit" if args.audit else "rebuild" if args.rebuild else None
    spark = _session(f"txn:{args.topology}:{mode or args.txid}")
    try:
        if mode == "audit":
            result = audit(spark, coordinator, args.topology, transform, schema=schema, required=required)
        elif mode == "rebuild":
            result = rebuild(spark, coordinator, args.topology, transform, schema=schema, required=required)
        else:
            result = process(spark, coordinator, args.topology, args.txid, transform, schema=schema,
                             required=required)
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
    log.info("result: %s", json.dumps(result, default=str))
    _write_result(args.result_file, result)
    return 1 if args.audit and result.get("differences") else 0


def _write_result(path: str | None, result: Mapping[str, Any]) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(result, fh, default=str)
