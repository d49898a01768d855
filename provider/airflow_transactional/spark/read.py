"""Reading a planned batch into Spark, exactly the plan: one reader per kind of source."""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from ..exceptions import BatchUnavailable, ConfigError
from ..model import FileBatch, LogBatch, PlannedBatch, planned_batch
from ..sources import LandingDirectory, PostgresLogSource, Source, source_from_config
from ..sources.base import Record
from ..store.connection import connect
from .handoff import StoreFile, is_remote, reader_options, store_file
from .pinned import executors_here, glob_escaped, pinned_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# Columns the helper adds to every record: where it came from.
OFFSET_COL, EVENT_ID_COL = "_offset", "_event_id"
#: A reader's verdict on a record it could read but not make text of (a TEXT reader may add it).
INVALID_COL = "_invalid"
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
#: A directory the process task and every executor see at the same path (shared storage, the
#: executors running as the driver's user: a spool is private to it): the driver spools an
#: event-log batch there as CSV files that the JVM reads. Local masters spool without it, into
#: ``spark.local.dir``; other masters and Spark Connect stream through the executors' Python
#: unless it is set.
SPOOL_CONF = "spark.airflow_transactional.logSpoolDir"
SPOOL_PREFIX = "txn-log-"  # then host, driver pid, a random part


def arrow_rows(batches: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """The rows of Arrow record batches, as tuples."""
    for batch in batches:
        yield from zip(*(col.to_pylist() for col in batch.columns), strict=True)


def _log_chunks(batch: Mapping[str, Any], size: int = LOG_CHUNK) -> list[tuple[int, int, int]]:
    batch = planned_batch(batch, PostgresLogSource.kind)
    chunks = []
    for p, lo, hi in batch.ranges if isinstance(batch, LogBatch) else ():
        for start in range(lo, hi, size):
            chunks.append((p, start, min(start + size, hi)))
    return chunks


def _arrow_log_chunks(store: StoreFile, schema: str, source_cfg: dict[str, Any], batches: Iterable[Any]
                      ) -> Iterator[Any]:
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
    conn = connect(store.dsn(), application_name="airflow_transactional:spark_read")
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


def reader_of(source: Source) -> Reader:
    """The Spark reader ``source`` names (``Source.spark_reader``, ``package.module.function``)."""
    module, _, name = source.spark_reader.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        found = None
    if not callable(found):
        raise ConfigError(f"sources of kind {source.kind!r} name no Spark reader this job can import "
                          f"({source.spark_reader!r}): set spark_reader on the source's class to "
                          "'package.module.function'")
    return cast(Reader, found)


def raw_schema() -> Any:
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField(OFFSET_COL, StringType()), StructField(EVENT_ID_COL, StringType()),
                       StructField("payload", StringType())])


def raw_records(spark: SparkSession, source: Source, batch: Mapping[str, Any], *, dsn: str, schema: str,
                topology_id: str, record_schema: str | None = None, retractions: frozenset[str] = frozenset()
                ) -> Records:
    """The batch (typed, or its stored JSON) as a DataFrame, and what it holds (see :class:`Records`).

    The event log gives ``(_offset, _event_id, payload)``; JSON files the fields of
    ``record_schema`` parsed by Spark's JSON reader; Parquet and CSV their own columns plus
    ``_offset``. ``retractions``: the offsets of the batch's records known to retract an event
    (:class:`~..sources.base.Versions`), read as records (a Kafka reader sets aside the others
    its records' headers say are retractions).
    """
    read = reader_of(source)
    known = {"retractions": retractions} if retractions else {}  # only then: a reader of one's own may not take it
    return read(spark, source, planned_batch(batch, source.kind), dsn=dsn, schema=schema, topology_id=topology_id,
                record_schema=record_schema, **known)


def replayed(spark: SparkSession, records: Sequence[Record]) -> Records:
    """A replay's records (quarantined ones, each as edited if it was) as raw text at their offsets."""
    rows = [(r.offset, r.event_id, r.payload) for r in records]
    return Records(spark.createDataFrame(rows, raw_schema()), TEXT)


def read_log(spark: SparkSession, source: Source, batch: Mapping[str, Any], *, dsn: str, schema: str,
             topology_id: str, **_: Any) -> Records:
    """A Postgres log batch: its LSN ranges in chunks, spooled as CSV files the JVM reads where the
    executors share the driver's storage (no Python between Postgres and Spark), else read on the
    executors."""
    chunks = _log_chunks(batch)
    if not chunks:
        return Records(spark.createDataFrame([], raw_schema()), TEXT)
    if not isinstance(source, PostgresLogSource):
        raise ConfigError(f"the log reader got a {source.kind!r} source")
    root = spool_root(spark)
    files = None if root is None else spool_log(source, _log_chunks(batch, _spool_chunk(spark, chunks)), root,
                                                dsn=dsn, schema=schema)
    if files is not None:
        return Records(read_spooled(spark, files), TEXT)
    return Records(stream_log(spark, source, chunks, dsn=dsn, schema=schema), TEXT)


def _spool_chunk(spark: SparkSession, chunks: list[tuple[int, int, int]]) -> int:
    """LSNs per spooled file: a file is one task (its quoted newlines make it unsplittable), so two
    per core of a local master, each one COPY; :data:`LOG_CHUNK` where the cores are unknown."""
    if is_remote(spark):
        return LOG_CHUNK
    events = sum(hi - lo for _p, lo, hi in chunks)
    return max(LOG_CHUNK, -(-events // (2 * spark.sparkContext.defaultParallelism)))


def spool_root(spark: SparkSession) -> str | None:
    """Where the driver may spool a log batch for the executors: :data:`SPOOL_CONF`, else Spark's
    scratch directory with a local master; None where the executors may not see the driver's
    files."""
    configured = spark.conf.get(SPOOL_CONF, None)
    if configured:
        return configured
    if not executors_here(spark):
        return None
    scratch = spark.conf.get("spark.local.dir", None)
    return scratch.split(",")[0] if scratch else tempfile.gettempdir()


def spool_log(source: PostgresLogSource, chunks: list[tuple[int, int, int]], root: str, *, dsn: str,
              schema: str) -> list[str] | None:
    """The events of ``chunks`` COPYed as CSV into files under ``root`` (one per chunk that has
    events; removed when the driver exits). None, with a warning, when ``root`` cannot take them
    (missing, read-only, full): the caller reads through the executors instead."""
    files, size, started, spool = [], 0, time.monotonic(), None
    try:
        os.makedirs(root, exist_ok=True)
        sweep_spools(root)
        spool = tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{socket.gethostname()}-{os.getpid()}-", dir=root)
        atexit.register(shutil.rmtree, spool, ignore_errors=True)
        conn = connect(dsn, application_name="airflow_transactional:spark_read")
        try:
            with conn, conn.cursor() as cur:
                for p, lo, hi in chunks:
                    path = os.path.join(spool, f"{p}-{lo}-{hi}.csv")
                    with open(path, "wb") as out:
                        source.copy_csv(cur, schema, p, lo, hi, out)
                        written = out.tell()
                    if written:
                        files.append(path)
                        size += written
        finally:
            conn.close()
    except OSError as exc:
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)
        log.warning("cannot spool the log batch under %s (%s): reading it through the executors", root, exc)
        return None
    log.info("spooled the log batch for the executors: %d files, %.1f MB in %.1f s (%s)", len(files), size / 1e6,
             time.monotonic() - started, spool)
    return files


def sweep_spools(root: str) -> list[str]:
    """Remove the spools under ``root`` that jobs killed on this host left (a killed driver runs
    no exit handler), and return them. A spool is named after its host and its driver's pid: one
    of this host whose process is gone is removed; another host's, or a live process's, is kept."""
    host, removed = socket.gethostname(), []
    for entry in os.scandir(root):
        rest = entry.name[len(SPOOL_PREFIX):] if entry.name.startswith(SPOOL_PREFIX) else ""
        owner, _, pid = rest.rpartition("-")[0].rpartition("-")
        if owner != host or not pid.isdigit() or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
        except OSError:  # alive, another user's
            pass
    if removed:
        log.info("removed %d log spools that killed jobs left under %s", len(removed), root)
    return removed


def read_spooled(spark: SparkSession, files: list[str]) -> DataFrame:
    """Spooled CSV files as (_offset, _event_id, payload) by the JVM's CSV reader, read exactly as
    Postgres wrote them: quoted values may hold newlines and doubled quotes, an unquoted empty
    field is NULL and a quoted one empty; anything else fails the read rather than bend a record."""
    if not files:
        return spark.createDataFrame([], raw_schema())
    # Postgres ends rows with \n and writes NULL as an unquoted empty field (its text holds no NUL,
    # so NUL names NULL here); lineSep also keeps a quoted \r from being turned into \n.
    return (spark.read.schema(raw_schema()).option("multiLine", True).option("escape", '"').option("lineSep", "\n")
            .option("nullValue", "\0").option("emptyValue", "").option("mode", "FAILFAST")
            .csv([glob_escaped(f) for f in files]))  # a temporary directory's name may hold [ or *


def stream_log(spark: SparkSession, source: PostgresLogSource, chunks: list[tuple[int, int, int]], *, dsn: str,
               schema: str) -> DataFrame:
    """The chunks read on the executors: each task COPYs its chunks into Arrow batches (the DSN
    from the file Spark hands it, :mod:`.handoff`)."""
    cfg = source.to_config()
    store = store_file(spark, dsn)
    ranges = spark.createDataFrame(chunks, "p long, lo long, hi long").repartition(min(len(chunks), 8))
    return ranges.mapInArrow(lambda batches: _arrow_log_chunks(store, schema, cfg, batches), raw_schema())


def read_landing(spark: SparkSession, source: Source, batch: Mapping[str, Any], *,
                 record_schema: str | None = None, **_: Any) -> Records:
    """A landing batch: its files with Spark's own readers.

    Parquet and CSV carry their columns. JSON Lines are parsed by Spark's JSON reader straight
    into the record schema's fields (a malformed line keeps its raw text in ``_corrupt_record``;
    blank lines are skipped; a line holding an array of objects is those records) -- a quarter
    less CPU than reading the text and parsing it with ``from_json``. A batch with a file whose
    registration found a line past the record limit or a surrogate's escape is read as text instead.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    if not isinstance(source, LandingDirectory):
        raise ConfigError(f"the landing reader got a {source.kind!r} source")
    batch = planned_batch(batch, source.kind)
    if not isinstance(batch, FileBatch) or not batch.files:
        return Records(spark.createDataFrame([], raw_schema()), TEXT)
    kind = batch.format
    if kind == "json" and not record_schema:
        raise ConfigError(NEEDS_SCHEMA)
    # A store's settings go to the reader as options: Spark hands them to the file system of this
    # read alone. Its credentials too -- except on Spark Connect, whose server shows every option.
    read = spark.read.options(**reader_options(spark, source.spark_options()))
    by_name, by_id = source.by_version(batch.files) if hasattr(source, "by_version") else (batch.files, [])
    if by_id:
        return _read_by_id(spark, source, read, by_name, by_id, kind)
    files, file_name = pinned_files(spark, batch.files)
    if kind == "parquet":
        return Records(read.parquet(*files).withColumn(OFFSET_COL, file_name), COLUMNS)
    if kind == "csv":
        return Records(read.option("header", True).csv(*files).withColumn(OFFSET_COL, file_name), COLUMNS)
    if not record_schema:
        raise ConfigError(NEEDS_SCHEMA)
    if not all(f.get("plain") for f in batch.files):
        # A line past the record limit or escaping a surrogate, somewhere (or a file registered before
        # lines were looked at): lines as text, judged one by one before they are parsed, as the
        # pure-Python processor reads them (Spark's JSON reader would parse any line, and store a
        # lone surrogate as '?').
        text = read.text(files).where(F.col("value").rlike("\\S"))
        return Records(text.select(file_name.alias(OFFSET_COL), F.lit(None).cast("string").alias(EVENT_ID_COL),
                                   F.col("value").alias("payload")), TEXT)
    fields = spark_schema(record_schema).fields
    parsed = (read.schema(StructType([*fields, StructField(CORRUPT_COL, StringType())]))
              .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_COL).json(files))
    return Records(parsed.select(file_name.alias(OFFSET_COL), F.lit(None).cast("string").alias(EVENT_ID_COL),
                                 *[f.name for f in fields], CORRUPT_COL), PARSED)


def _read_by_id(spark: SparkSession, source: Any, read: Any, by_name: Sequence[Mapping[str, Any]],
                by_id: Sequence[Mapping[str, Any]], kind: str) -> Records:
    """A batch on a store that keeps versions, some of whose planned versions their names no longer
    hold: those read here by their id, the rest by Spark's reader by name -- all as text, each line
    judged (a store's file is recorded under its URL, whichever way it was read)."""
    from pyspark.sql import functions as F

    if kind != "json":
        raise BatchUnavailable(f"{kind} file {by_id[0]['path']}: its planned version is no longer what its name "
                               f"holds, and Spark reads {kind} files by name only -- land JSON lines, or declare the "
                               "topology opaque=True to record the loss and go on")
    rows = [(str(f["path"]), None, line) for f in by_id for line in source.version_lines(f)]
    here = spark.createDataFrame(rows, raw_schema())
    if not by_name:
        return Records(here, TEXT)
    files, file_name = pinned_files(spark, by_name)
    text = read.text(files).where(F.col("value").rlike("\\S"))
    return Records(text.select(file_name.alias(OFFSET_COL), F.lit(None).cast("string").alias(EVENT_ID_COL),
                               F.col("value").alias("payload")).unionByName(here), TEXT)


def as_text(batch: Mapping[str, Any]) -> PlannedBatch:
    """A landing ``batch`` whose JSON files are read as text, line by line (:func:`read_landing`)."""
    typed = planned_batch(batch, LandingDirectory.kind)
    if not isinstance(typed, FileBatch):
        return typed
    return replace(typed, files=tuple({**f, "plain": False} for f in typed.files))


def spark_schema(ddl: str) -> Any:
    """The ``StructType`` of a record schema in DDL (``"url string, n bigint"``)."""
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(ddl)
    if not isinstance(schema, StructType) or not schema.fields:
        raise ConfigError(f"record schema {ddl!r} has no fields")
    return schema


def readable_batch(batch: Mapping[str, Any], source: Any = None) -> tuple[PlannedBatch, list[tuple[str, str]]]:
    """The batch without its Parquet files whose footer cannot be read, and (path, why) of those
    (on S3 or HDFS as its ``source`` reads them: ``unreadable_files``).

    A corrupt file would otherwise fail every attempt and stop the topology; it is quarantined
    by name instead (or fails the attempt naming it, with ``on_bad_record="fail"``).
    """
    typed = planned_batch(batch)
    if not isinstance(typed, FileBatch) or typed.format != "parquet":
        return typed, []
    if "://" in str(typed.directory):
        on_a_store = getattr(source, "unreadable_files", None)
        unreadable = on_a_store(typed.files) if on_a_store is not None else []
    else:
        unreadable = [(f["path"], why) for f in typed.files if (why := _local_parquet_problem(f["path"]))]
    gone = {p for p, _ in unreadable}
    return replace(typed, files=tuple(f for f in typed.files if f["path"] not in gone)), unreadable


def _local_parquet_problem(path: str) -> str | None:
    import pyarrow.parquet as pq

    try:
        pq.ParquetFile(path).metadata  # noqa: B018 -- reading the footer is the check
    except Exception as exc:
        return f"unreadable Parquet file: {type(exc).__name__}: {exc}"[:1000]
    return None
