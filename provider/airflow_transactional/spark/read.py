"""Reading a planned batch into Spark, exactly the plan: one reader per kind of source."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ..exceptions import ConfigError
from ..sources import LandingDirectory, PostgresLogSource, Source, source_from_config
from ..store.connection import connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("airflow_transactional.spark_job")

# Columns the helper adds to every record: where it came from.
OFFSET_COL, EVENT_ID_COL = "_offset", "_event_id"
#: The column Spark's JSON parser puts a malformed record's raw text in.
CORRUPT_COL = "_corrupt_record"
NEEDS_SCHEMA = "text sources need a record schema: run(transform, schema='field type, ...')"

# What a reader's DataFrame holds, besides _offset and _event_id:
TEXT = "text"  # a ``payload`` column of raw JSON text, parsed by validate
PARSED = "parsed"  # the record schema's fields, parsed by Spark's JSON reader, and _corrupt_record
COLUMNS = "columns"  # the file's own columns (Parquet, CSV)


class Records(NamedTuple):
    """A batch as read: the DataFrame and which of :data:`TEXT`, :data:`PARSED`, :data:`COLUMNS` it holds."""

    df: DataFrame
    form: str
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


def _arrow_log_chunks(dsn: str, schema: str, source_cfg: dict[str, Any], batches: Iterable[Any]) -> Iterator[Any]:
    """Executor side: the events of some LSN chunks (Arrow batches of ``p, lo, hi``) as Arrow
    batches of (_offset, _event_id, payload), read by COPY as CSV and parsed by Arrow in bulk."""
    import io

    import pyarrow as pa
    import pyarrow.csv as pacsv

    source = source_from_config(source_cfg)
    if not isinstance(source, PostgresLogSource):
        raise ConfigError(f"the log reader got a {source.kind!r} source")
    names = [OFFSET_COL, EVENT_ID_COL, "payload"]
    read = pacsv.ReadOptions(column_names=names)
    parse = pacsv.ParseOptions(newlines_in_values=True)
    convert = pacsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()), strings_can_be_null=True,
                                   quoted_strings_can_be_null=False)
    conn = connect(dsn, application_name="airflow_transactional:spark_read")
    try:
        with conn, conn.cursor() as cur:
            for p, lo, hi in arrow_rows(batches):
                buf = io.BytesIO()
                source.copy_csv(cur, schema, p, lo, hi, buf)
                if buf.tell():
                    buf.seek(0)
                    yield from pacsv.read_csv(buf, read, parse, convert).to_batches()
    finally:
        conn.close()


Reader = Callable[..., Records]
#: The Spark reader of each kind of source, by ``Source.kind``: a new source registers its own
#: with :func:`reader` (no chain of isinstance checks to extend).
READERS: dict[str, Reader] = {}


def reader(kind: str) -> Callable[[Reader], Reader]:
    """Register ``fn(spark, source, batch, *, dsn, schema, topology_id, record_schema) -> Records``."""
    def register(fn: Reader) -> Reader:
        READERS[kind] = fn
        return fn
    return register


def raw_schema() -> Any:
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField(OFFSET_COL, StringType()), StructField(EVENT_ID_COL, StringType()),
                       StructField("payload", StringType())])


def raw_records(spark: SparkSession, source: Source, batch: Mapping[str, Any], *, dsn: str, schema: str,
                topology_id: str, record_schema: str | None = None) -> Records:
    """The batch as a DataFrame, and what it holds (see :class:`Records`).

    The event log gives ``(_offset, _event_id, payload)``; JSON files the fields of
    ``record_schema`` parsed by Spark's JSON reader; Parquet and CSV their own columns plus
    ``_offset``.
    """
    read = READERS.get(source.kind)
    if read is None:
        raise ConfigError(f"the Spark helper has no reader for sources of kind {source.kind!r}: register one "
                          "with airflow_transactional.spark.read.reader")
    return read(spark, source, batch, dsn=dsn, schema=schema, topology_id=topology_id, record_schema=record_schema)


@reader(PostgresLogSource.kind)
def read_log(spark: SparkSession, source: Source, batch: Mapping[str, Any], *, dsn: str, schema: str,
             topology_id: str, **_: Any) -> Records:
    """A Postgres log batch: its LSN ranges in chunks, read on the executors."""
    chunks = _log_chunks(batch)
    if not chunks:
        return Records(spark.createDataFrame([], raw_schema()), TEXT)
    cfg = source.to_config()
    ranges = spark.createDataFrame(chunks, "p long, lo long, hi long").repartition(min(len(chunks), 8))
    return Records(ranges.mapInArrow(lambda batches: _arrow_log_chunks(dsn, schema, cfg, batches), raw_schema()),
                   TEXT)


@reader(LandingDirectory.kind)
def read_landing(spark: SparkSession, source: Source, batch: Mapping[str, Any], *,
                 record_schema: str | None = None, **_: Any) -> Records:
    """A landing batch: its files with Spark's own readers.

    Parquet and CSV carry their columns. JSON Lines are parsed by Spark's JSON reader straight
    into the record schema's fields (a malformed line keeps its raw text in ``_corrupt_record``;
    blank lines are skipped; a line holding an array of objects is those records) -- a quarter
    less CPU than reading the text and parsing it with ``from_json``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    files = [f["path"] for f in batch.get("files", [])]
    if not files:
        return Records(spark.createDataFrame([], raw_schema()), TEXT)
    if batch.get("format", "json") == "parquet":
        return Records(spark.read.parquet(*files).withColumn(OFFSET_COL, F.input_file_name()), COLUMNS)
    if batch.get("format") == "csv":
        return Records(spark.read.option("header", True).csv(*files).withColumn(OFFSET_COL, F.input_file_name()),
                       COLUMNS)
    if not record_schema:
        raise ConfigError(NEEDS_SCHEMA)
    fields = spark_schema(record_schema).fields
    parsed = (spark.read.schema(StructType([*fields, StructField(CORRUPT_COL, StringType())]))
              .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_COL).json(files))
    return Records(parsed.select(F.input_file_name().alias(OFFSET_COL), F.lit(None).cast("string").alias(EVENT_ID_COL),
                                 *[f.name for f in fields], CORRUPT_COL), PARSED)


def spark_schema(ddl: str) -> Any:
    """The ``StructType`` of a record schema in DDL (``"url string, n bigint"``)."""
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(ddl)
    if not isinstance(schema, StructType) or not schema.fields:
        raise ConfigError(f"record schema {ddl!r} has no fields")
    return schema


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
