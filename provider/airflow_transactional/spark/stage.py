"""Folding each state's rows per key, and staging them: COPY from the executors, in parallel."""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError
from ..spec import StateSpec
from ..store.connection import connect
from ..store.copy import copy_line
from ..values import Combiner
from .read import arrow_rows, is_remote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


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


def copy_partition(dsn: str, copy_sql: str, prefix: Sequence[Any], rows: Iterable[Any],
                   counter: Any = None) -> int:
    """Executor side: COPY one partition's rows into a table in one transaction; the count."""
    buf = io.StringIO()
    head = copy_line(prefix)[:-1] + "\t" if prefix else ""
    n = 0
    for row in rows:
        buf.write(head + copy_line(row))
        n += 1
    if not n:
        return 0
    buf.seek(0)
    conn = connect(dsn, application_name="airflow_transactional:spark_stage")
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

    yield pa.RecordBatch.from_pydict({"n": [copy_partition(dsn, copy_sql, prefix, arrow_rows(batches))]})


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
