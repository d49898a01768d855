"""Folding each state's rows per key, and staging them: a small result from the driver in one
COPY, a big one from the executors in parallel -- in Arrow batches written as CSV either way."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError
from ..spec import StateSpec
from ..store.connection import connect
from ..values import Combiner

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


def fold(state: StateSpec, df: DataFrame) -> DataFrame:
    """One row per key: the state's combiner over the rows the transform produced."""
    from pyspark.sql import functions as F

    keys = state.key_columns
    missing = [c for c in (*keys, "value") if c not in df.columns]
    if missing:
        raise ConfigError(f"the transform's DataFrame for state {state.name!r} lacks columns {missing}: "
                          f"it must have {', '.join(keys)} and value (has {', '.join(df.columns)})")
    combine = combined(state)
    null_key = " OR ".join(f"`{k}` IS NULL" for k in keys)
    return (df.select(*keys, "value").where(f"NOT ({null_key})")
            .groupBy(*keys).agg(combine(F.col("value")).alias("value")))


def combined(state: StateSpec) -> Callable[[Column], Column]:
    """``values -> the state's combiner over them``, as the state's value type: how every fold
    of ``state`` aggregates a key's rows (a row without all its keys is never folded)."""
    from pyspark.sql import functions as F

    agg = {Combiner.SUM: F.sum, Combiner.COUNT: F.sum, Combiner.MIN: F.min,
           Combiner.MAX: F.max}.get(Combiner(state.combiner))
    if agg is None:
        raise ConfigError(f"state {state.name!r}: the Spark helper folds sum, count, min and max; for "
                          "'replace' keep one row per key in the transform and use combiner 'max' on a "
                          "version column, or process with the pure-Python processor")
    spark_type = _spark_type(state.value_type)
    return lambda values: agg(values).cast(spark_type)


def output_events(topology_id: str, output: str, partitions: int, df: DataFrame,
                  decisions: Sequence[str] = ()) -> DataFrame:
    """The events a transform returned for ``output`` as staged rows: partition, seq, event_id,
    payload, decision, request, granted.

    ``df`` has ``id`` (the event's origin, e.g. ``concat(_event_id, lit(':granted'))``; the log's
    event id is ``"<topology>:<id>"``) and ``payload`` (text, or a struct/map written as JSON);
    optionally ``key`` (the partition key, default the event id) and ``seq`` (the order in the
    log within the txid, then the id). Of events sharing an id the first in that order is kept,
    as the log itself keeps the first delivery of an id. An event with a ``request`` (a request
    id of one of ``decisions``, named by a ``decision`` column when there are several) is
    appended only if the request gets the verdict its ``when`` says: ``granted`` or ``declined``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    missing = [c for c in ("id", "payload") if c not in df.columns]
    if missing:
        raise ConfigError(f"the transform's DataFrame for output {output!r} lacks columns {missing}: it must have "
                          "id (the event's origin, e.g. concat(_event_id, lit(':granted'))) and payload (text or "
                          f"a struct), and may have key and seq (has {', '.join(df.columns)})")
    conditional = "request" in df.columns
    if conditional and ("when" not in df.columns or not decisions
                        or (len(decisions) > 1 and "decision" not in df.columns)):
        raise ConfigError(f"output {output!r}: events with a request column also need when ('granted' or "
                          "'declined')" + (", and decision (the topology has several)" if len(decisions) > 1
                                           else "") + f"; the topology's decisions: {list(decisions) or 'none'}")
    verdict = [F.lit(None).cast("string").alias("decision"), F.lit(None).cast("string").alias("request"),
               F.lit(None).cast("boolean").alias("granted")]
    if conditional:
        decision = F.col("decision").cast("string") if "decision" in df.columns else F.lit(decisions[0])
        when = F.lower(F.col("when").cast("string"))
        verdict = [decision.alias("decision"), F.col("request").cast("string").alias("request"),
                   F.when(when == "granted", True).when(when == "declined", False)
                   .otherwise(F.raise_error(F.concat(F.lit(f"output {output!r}: when must be 'granted' or "
                                                           "'declined', got "), F.coalesce(when, F.lit("null")))))
                   .alias("granted")]
    payload = F.col("payload")
    if not isinstance(df.schema["payload"].dataType, StringType):
        payload = F.to_json(payload)
    event_id = F.concat(F.lit(f"{topology_id}:"), F.col("id").cast("string"))
    key = F.coalesce(F.col("key").cast("string"), event_id) if "key" in df.columns else event_id
    seq = F.col("seq").cast("long") if "seq" in df.columns else F.lit(None).cast("long")
    # crc32 of the UTF-8 bytes, as sources.eventlog.partition_of computes it.
    rows = df.select((F.crc32(key.cast("binary")) % F.lit(partitions)).cast("int").alias("partition"),
                     seq.alias("seq"), event_id.alias("event_id"), payload.alias("payload"), *verdict)
    return _first_by_seq(rows, "event_id", "payload")


def decision_requests(decision: str, state: StateSpec, df: DataFrame) -> DataFrame:
    """The requests a transform returned for ``decision`` as staged rows: keys, seq, request, amount.

    ``df`` has the decision state's key columns, ``amount`` and ``id`` (the request id), and may
    have ``seq`` (the order of a key's requests within the txid, then the id). Of requests sharing
    an id the first in that order is kept (one request is decided once).
    """
    from pyspark.sql import functions as F

    keys = state.key_columns
    missing = [c for c in (*keys, "amount", "id") if c not in df.columns]
    if missing:
        raise ConfigError(f"the transform's DataFrame for decision {decision!r} lacks columns {missing}: it must have "
                          f"{', '.join(keys)}, amount and id, and may have seq (has {', '.join(df.columns)})")
    seq = F.col("seq").cast("long") if "seq" in df.columns else F.lit(None).cast("long")
    rows = df.select(*keys, seq.alias("seq"), F.col("id").cast("string").alias("request"),
                     F.col("amount").cast(_spark_type(state.value_type)).alias("amount"))
    return _first_by_seq(rows, "request", "amount")


def _first_by_seq(rows: DataFrame, id_column: str, then: str) -> DataFrame:
    """Of the rows sharing ``id_column``, the first by ``seq`` (nulls last), then ``then``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    first = Window.partitionBy(id_column).orderBy(F.col("seq").asc_nulls_last(), F.col(then))
    return rows.withColumn("_n", F.row_number().over(first)).where("_n = 1").drop("_n")


def _spark_type(sql_type: str) -> str:
    return {"bigint": "bigint", "integer": "int", "numeric": "decimal(38,10)",
            "double precision": "double"}.get(sql_type, "string")


#: How much CSV an executor buffers before it sends it (one COPY per chunk, one transaction per
#: partition): a partition of huge bad records never has to fit in memory whole.
COPY_CHUNK_BYTES = 32 << 20


def copy_batches(dsn: str, copy_sql: str, prefix: Sequence[Any], batches: Iterable[Any]) -> int:
    """Executor side: COPY one partition's Arrow record batches, as CSV built by Arrow in bulk
    (no Python per row), with ``prefix`` as leading constant columns, in one transaction; the count.

    ``copy_sql`` is a ``COPY ... FROM STDIN WITH (FORMAT csv)``: Arrow writes a null as an empty
    field and an empty string as ``""``, which is how CSV COPY tells them apart.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    options = pacsv.WriteOptions(include_header=False)
    buf, n, conn = io.BytesIO(), 0, None

    def send() -> None:
        nonlocal conn
        conn = conn or connect(dsn, application_name="airflow_transactional:spark_stage")
        buf.seek(0)
        with conn.cursor() as cur:
            cur.copy_expert(copy_sql, buf)

    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if prefix:
                consts = [pa.array([value] * batch.num_rows) for value in prefix]
                batch = pa.RecordBatch.from_arrays([*consts, *batch.columns],
                                                   names=[f"_p{i}" for i in range(len(prefix))] + batch.schema.names)
            pacsv.write_csv(batch, buf, options)
            n += batch.num_rows
            if buf.tell() >= COPY_CHUNK_BYTES:
                send()
                buf = io.BytesIO()
        if buf.tell():
            send()
        if conn is not None:
            conn.commit()
    finally:
        if conn is not None:
            conn.close()
    return n


#: A fold with at most this many rows (keys) is staged from the driver: collected as Arrow and
#: sent in one COPY, with no Python worker on the executors and no second job. A bigger one is
#: staged from the executors, in parallel. (At 250,000 keys of ~100 bytes the driver holds ~25 MB.)
DRIVER_STAGE_ROWS = 250_000


def stage_fold(df: DataFrame, dsn: str, copy_sql: str, prefix: Sequence[Any],
               driver_rows: int = DRIVER_STAGE_ROWS) -> int:
    """Stage a state's folded rows (see :data:`DRIVER_STAGE_ROWS`); the rows written.

    The fold is computed once: it is cached while the driver takes up to ``driver_rows + 1`` of
    its rows, and only a fold bigger than that goes on to the executors, from the cache.
    """
    from pyspark import StorageLevel

    folded = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        head = folded.limit(driver_rows + 1).toArrow()
        if head.num_rows <= driver_rows:
            return copy_batches(dsn, copy_sql, prefix, head.to_batches())
        return copy_dataframe(None, folded, dsn, copy_sql, prefix)
    finally:
        folded.unpersist()


def _copy_arrow(dsn: str, copy_sql: str, prefix: Sequence[Any], batches: Iterable[Any]) -> Iterator[Any]:
    import pyarrow as pa

    yield pa.RecordBatch.from_pydict({"n": [copy_batches(dsn, copy_sql, prefix, batches)]})


def copy_dataframe(spark: SparkSession | None, df: DataFrame, dsn: str, copy_sql: str, prefix: Sequence[Any]) -> int:
    """COPY a DataFrame from the executors, in parallel, in Arrow batches; return the rows written.
    The same for a classic session and a Spark Connect one (``spark`` is kept for callers)."""
    from pyspark.sql import functions as F

    counts = df.mapInArrow(lambda batches: _copy_arrow(dsn, copy_sql, prefix, batches), "n long")
    return int(counts.agg(F.sum("n")).collect()[0][0] or 0)
