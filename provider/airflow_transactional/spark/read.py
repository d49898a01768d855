"""Reading a planned batch into Spark, exactly the plan: one reader per kind of source."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError
from ..sources import LandingDirectory, PostgresLogSource, Source, source_from_config
from ..store.connection import connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("airflow_transactional.spark_job")

# Columns the helper adds to every record: where it came from.
OFFSET_COL, EVENT_ID_COL = "_offset", "_event_id"
LOG_CHUNK = 50_000  # LSNs per Spark task when reading a Postgres log range


def is_remote(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def arrow_rows(batches: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """The rows of Arrow record batches, as tuples."""
    for batch in batches:
        yield from zip(*(col.to_pylist() for col in batch.columns), strict=True)


def _log_chunks(batch: Mapping[str, Any], size: int = LOG_CHUNK) -> list[tuple[int, int, int]]:
    chunks = []
    for p, lo, hi in batch.get("ranges", []):
        for start in range(int(lo), int(hi), size):
            chunks.append((int(p), start, min(start + size, int(hi))))
    return chunks


def _read_log_chunks(dsn: str, schema: str, topology_id: str, source_cfg: dict[str, Any],
                     chunks: Iterable[tuple[int, int, int]]) -> Iterator[tuple[str, str | None, str]]:
    """Executor side: stream the events of some LSN chunks (the source's own read)."""
    source = source_from_config(source_cfg)
    conn = connect(dsn, application_name="airflow_transactional:spark_read")
    try:
        with conn, conn.cursor() as cur:
            for p, lo, hi in chunks:
                for rec in source.read(cur, schema, topology_id, {"ranges": [[p, lo, hi]]}):
                    yield rec.offset, rec.event_id, rec.payload
    finally:
        conn.close()


def _arrow_log_chunks(dsn: str, schema: str, topology_id: str, source_cfg: dict[str, Any],
                      batches: Iterable[Any], size: int = 10_000) -> Iterator[Any]:
    """Executor side, Connect: :func:`_read_log_chunks` over Arrow batches of (p, lo, hi)."""
    import pyarrow as pa

    names = [OFFSET_COL, EVENT_ID_COL, "payload"]
    out: list[tuple[str, str | None, str]] = []
    for rec in _read_log_chunks(dsn, schema, topology_id, source_cfg, arrow_rows(batches)):
        out.append(rec)
        if len(out) >= size:
            yield pa.RecordBatch.from_arrays([pa.array(c, pa.string()) for c in zip(*out, strict=True)], names)
            out = []
    if out:
        yield pa.RecordBatch.from_arrays([pa.array(c, pa.string()) for c in zip(*out, strict=True)], names)


Reader = Callable[..., tuple["DataFrame", bool]]
#: The Spark reader of each kind of source, by ``Source.kind``: a new source registers its own
#: with :func:`reader` (no chain of isinstance checks to extend).
READERS: dict[str, Reader] = {}


def reader(kind: str) -> Callable[[Reader], Reader]:
    """Register ``fn(spark, source, batch, *, dsn, schema, topology_id) -> (DataFrame, is_text)``."""
    def register(fn: Reader) -> Reader:
        READERS[kind] = fn
        return fn
    return register


def raw_schema() -> Any:
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField(OFFSET_COL, StringType()), StructField(EVENT_ID_COL, StringType()),
                       StructField("payload", StringType())])


def raw_records(spark: SparkSession, source: Source, batch: Mapping[str, Any], *, dsn: str, schema: str,
                topology_id: str) -> tuple[DataFrame, bool]:
    """The batch as a DataFrame and whether it holds raw text payloads (to be parsed).

    Text sources give ``(_offset, _event_id, payload)``; Parquet gives its own columns plus
    ``_offset``.
    """
    read = READERS.get(source.kind)
    if read is None:
        raise ConfigError(f"the Spark helper has no reader for sources of kind {source.kind!r}: register one "
                          "with airflow_transactional.spark.read.reader")
    return read(spark, source, batch, dsn=dsn, schema=schema, topology_id=topology_id)


@reader(PostgresLogSource.kind)
def read_log(spark: SparkSession, source: Source, batch: Mapping[str, Any], *, dsn: str, schema: str,
             topology_id: str) -> tuple[DataFrame, bool]:
    """A Postgres log batch: its LSN ranges in chunks, read on the executors."""
    chunks = _log_chunks(batch)
    if not chunks:
        return spark.createDataFrame([], raw_schema()), True
    cfg = source.to_config()
    if is_remote(spark):
        ranges = spark.createDataFrame(chunks, "p long, lo long, hi long").repartition(min(len(chunks), 8))
        return ranges.mapInArrow(lambda batches: _arrow_log_chunks(dsn, schema, topology_id, cfg, batches),
                                 raw_schema()), True
    n = max(1, min(len(chunks), spark.sparkContext.defaultParallelism * 4))
    rdd = spark.sparkContext.parallelize(chunks, n).mapPartitions(
        lambda it: _read_log_chunks(dsn, schema, topology_id, cfg, it))
    return spark.createDataFrame(rdd, raw_schema()), True


@reader(LandingDirectory.kind)
def read_landing(spark: SparkSession, source: Source, batch: Mapping[str, Any], **_: Any) -> tuple[DataFrame, bool]:
    """A landing batch: its files with Spark's own readers (Parquet and CSV carry their columns)."""
    from pyspark.sql import functions as F

    files = [f["path"] for f in batch.get("files", [])]
    if not files:
        return spark.createDataFrame([], raw_schema()), True
    if batch.get("format", "json") == "parquet":
        return spark.read.parquet(*files).withColumn(OFFSET_COL, F.input_file_name()), False
    if batch.get("format") == "csv":
        return spark.read.option("header", True).csv(*files).withColumn(OFFSET_COL, F.input_file_name()), False
    df = spark.read.text(files).where(F.trim("value") != "")
    return df.select(F.input_file_name().alias(OFFSET_COL), F.lit(None).cast("string").alias(EVENT_ID_COL),
                     F.col("value").alias("payload")), True


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
