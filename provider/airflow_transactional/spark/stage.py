"""Folding each state's rows per key, and staging them: a small result from the driver in one
COPY, a big one from the executors in parallel -- in Arrow batches written as CSV either way.
A row that cannot be staged (:mod:`.admit`) goes to the attempt's quarantine instead."""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .. import faults, limits
from ..exceptions import ConfigError
from ..limits import QUARANTINE_RECORD_CHARS
from ..model import RETRACTED, Staging
from ..spec import StateSpec
from ..store.connection import connect
from . import admit
from .admit import SetAside
from .handoff import StoreFile, store_file

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


def fold(state: StateSpec, df: DataFrame) -> DataFrame:
    """One row per key: the state's combiner over the rows the transform produced (a row without
    all its keys is never folded; null values are left out, as SQL's aggregates do, and a key
    whose values are all null contributes nothing), judged (:func:`.admit.judged_fold`)."""
    from pyspark.sql import functions as F

    keys = state.key_columns
    missing = [c for c in (*keys, "value") if c not in df.columns]
    if missing:
        raise ConfigError(f"the transform's DataFrame for state {state.name!r} lacks columns {missing}: "
                          f"it must have {', '.join(keys)} and value (has {', '.join(df.columns)})")
    null_key = " OR ".join(f"`{k}` IS NULL" for k in keys)
    folded = (df.select(*keys, "value").where(f"NOT ({null_key})")
              .groupBy(*keys).agg(*admit.fold_columns(state, F.col("value"), "value")))
    return folded.where("value_n > 0").select(
        *admit.judged_fold(state, {k: F.col(k) for k in keys}, F.col("value"), F.col("value_n")))


def output_events(topology_id: str, output: str, partitions: int, df: DataFrame,
                  decisions: Sequence[str] = (), txid: int = 0) -> DataFrame:
    """The events a transform returned for ``output`` as staged rows: partition, seq, event_id,
    payload, decision, request, granted, retraction.

    ``df`` has ``id`` (the event's origin, e.g. ``concat(_event_id, lit(':granted'))``; the log's
    event id is ``"<topology>:<id>"``) and ``payload`` (text, or a struct/map written as JSON);
    optionally ``key`` (the partition key, default the event id) and ``seq`` (the order in the
    log within the txid, then the id). Of events sharing an id the first in that order is kept,
    as the log itself keeps the first delivery of an id. An event with a ``request`` (a request
    id of one of ``decisions``, named by a ``decision`` column when there are several) is
    appended only if the request gets the verdict its ``when`` says: ``granted`` or ``declined``.
    In a batch that read a correction's events upstream (``_retraction``, :func:`.batch.negating`)
    an event of a retraction is staged as the retraction of that event (id
    ``<event id>~retracted@<txid>``), resolved by the commit (store/outputs.py).
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
    seq = F.col("seq").try_cast("long") if "seq" in df.columns else F.lit(None).cast("long")
    # crc32 of the UTF-8 bytes, as sources.eventlog.partition_of computes it.
    partition = (F.crc32(key.cast("binary")) % F.lit(partitions)).cast("int")
    retraction = F.col("_retraction") if "_retraction" in df.columns else F.lit(None).cast("boolean")
    event_id = F.when(retraction, F.concat(event_id, F.lit(f"{RETRACTED}{txid}"))).otherwise(event_id)
    rows = df.select(partition.alias("partition"), seq.alias("seq"), event_id.alias("event_id"),
                     payload.alias("payload"), *verdict, retraction.alias("retraction"))
    why = admit.first_reason([*admit.id_reasons(f"the id of an output event for {output!r}", F.col("event_id")),
                        (F.col("payload").isNull(), f"an output event for {output!r} has no payload"),
                        (F.instr(F.col("payload"), "\u0000") > 0, f"the payload of an output event for {output!r} "
                                                                  "holds a NUL byte (\\u0000)"),
                        (F.octet_length(F.col("payload")) > limits.MAX_RECORD_BYTES,
                         f"output event for {output!r}: {limits.RECORD_TOO_LARGE}"),
                        (admit.lone_surrogate(F.col("payload")),
                         f"output event for {output!r}: {limits.LONE_SURROGATE}")])
    return _judged(_first_by_seq(rows, "event_id", "payload"), why)


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
    seq = F.col("seq").try_cast("long") if "seq" in df.columns else F.lit(None).cast("long")
    rows = df.select(*[F.col(k).alias(k) for k in keys], seq.alias("seq"), F.col("id").cast("string").alias("request"),
                     F.col("amount").alias("_amount"))
    why = admit.first_reason([*admit.id_reasons(f"the id of a request for {decision!r}", F.col("request")),
                        (F.col(keys[0]).isNull() if len(keys) == 1 else F.greatest(*[F.col(k).isNull() for k in keys]),
                         f"a request for {decision!r} has a null key"),
                        *admit.key_reasons(f"the key of a request for {decision!r}", state.keys,
                                           {k: F.col(k) for k in keys}),
                        (F.col("_amount").isNull(), f"a request for {decision!r} has no amount"),
                        *admit.value_reasons(f"the amount of a request for {decision!r}", state.value_type,
                                             F.col("_amount"))])
    rows = rows.select(*[F.col(k).try_cast(admit.spark_type(t)).alias(k) for k, t in state.keys.items()], "seq",
                       "request", F.col("_amount").try_cast(admit.spark_type(state.value_type)).alias("amount"),
                       why.alias("_w"))
    return _judged(_first_by_seq(rows, "request", "amount"), F.col("_w"))


def _first_by_seq(rows: DataFrame, id_column: str, then: str) -> DataFrame:
    """Of the rows sharing ``id_column``, the first by ``seq`` (nulls last), then ``then``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    first = Window.partitionBy(id_column).orderBy(F.col("seq").asc_nulls_last(), F.col(then))
    return rows.withColumn("_n", F.row_number().over(first)).where("_n = 1").drop("_n")


def _judged(rows: DataFrame, why: Column) -> DataFrame:
    """``rows`` with :data:`.admit.WHY` (``why``) and, for a row that cannot be staged, :data:`.admit.RECORD`."""
    from pyspark.sql import functions as F

    cols = [c for c in rows.columns if c != "_w"]
    return rows.select(*cols, why.alias(admit.WHY)).withColumn(
        admit.RECORD, F.when(F.col(admit.WHY).isNotNull(), F.to_json(F.struct(*[F.col(c) for c in cols]))))


#: How much CSV an executor buffers before it sends it (one COPY per chunk, one transaction per
#: partition): a partition of huge bad records never has to fit in memory whole.
COPY_CHUNK_BYTES = 32 << 20


def copy_batches(dsn: str, target: Staging, batches: Iterable[Any], *, slice_of: str | None = None) -> int:
    """Executor side: COPY one partition's Arrow record batches into ``target``, as CSV built by
    Arrow in bulk (no Python per row), its prefix as leading constant columns, in one transaction;
    the count.

    The target's COPY is a ``COPY ... FROM STDIN WITH (FORMAT csv)``: Arrow writes a null as an empty
    field and an empty string as ``""``, which is how CSV COPY tells them apart. With ``slice_of``
    (a quarantine COPY) two more constants follow the prefix: the slice (``slice_of`` and the Spark
    partition) and the writer (the Spark task attempt; null on the driver), see :func:`writer_of`.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    prefix = target.prefix if slice_of is None else (*target.prefix, *writer_of(slice_of))
    options = pacsv.WriteOptions(include_header=False)
    buf, n, conn = io.BytesIO(), 0, None

    def send() -> None:
        nonlocal conn
        conn = conn or connect(dsn, application_name="airflow_transactional:spark_stage")
        buf.seek(0)
        with conn.cursor() as cur:
            cur.copy_expert(target.copy, buf)

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
    if slice_of is not None:
        faults.point("quarantine.after_copy")  # a task that fails here is run again, and copies again
    return n


def writer_of(slice_of: str) -> tuple[str, int | None]:
    """Who runs this COPY: (``slice_of:<Spark partition>``, the task attempt's id) in a Spark task;
    (``slice_of``, None) on the driver, which runs each COPY once."""
    from pyspark import TaskContext

    task = TaskContext.get()
    if task is None:
        return slice_of, None
    return f"{slice_of}:{task.partitionId()}", task.taskAttemptId()


#: A fold with at most this many rows (keys) is staged from the driver: collected as Arrow and
#: sent in one COPY, with no Python worker on the executors and no second job. A bigger one is
#: staged from the executors, in parallel. (At 250,000 keys of ~100 bytes the driver holds ~25 MB.)
DRIVER_STAGE_ROWS = 250_000


def stage_fold(df: DataFrame, dsn: str, target: Staging, driver_rows: int = DRIVER_STAGE_ROWS, *,
               set_aside: SetAside | None = None, label: str = "") -> int:
    """Stage a state's folded rows, a decision's requests or an output's events (see
    :data:`DRIVER_STAGE_ROWS`); the rows written. A judged frame's rows that cannot be staged
    (:data:`.admit.WHY`) go to ``set_aside`` instead, their offset ``label`` (dropped without one:
    an audit or a rebuild recomputes what the commits kept).

    The frame is computed once: it is cached while the driver takes up to ``driver_rows + 1`` of
    its rows, and only a frame bigger than that goes on to the executors, from the cache.
    """
    from pyspark import StorageLevel

    folded = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        head = folded.limit(driver_rows + 1).toArrow()
        if head.num_rows <= driver_rows:
            return stage_arrow(head, dsn, target, set_aside=set_aside, label=label)
        return stage_executors(folded, dsn, target, set_aside=set_aside, label=label)
    finally:
        folded.unpersist()


def stage_arrow(rows: Any, dsn: str, target: Staging, *, set_aside: SetAside | None = None,
                label: str = "") -> int:
    """From the driver: COPY an Arrow table of rows to stage; its judged rows that cannot be go to
    ``set_aside``. The rows staged."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if admit.WHY not in rows.column_names:
        return copy_batches(dsn, target, rows.to_batches())
    fine = pc.is_null(rows[admit.WHY])
    bad = rows.filter(pc.invert(fine))
    if bad.num_rows and set_aside is not None:
        record = bad[admit.RECORD]
        table = pa.table({"offset": pa.array([label] * bad.num_rows), "event_id": pa.nulls(bad.num_rows, pa.string()),
                          "reason": bad[admit.WHY],
                          "record": pc.utf8_slice_codeunits(record, 0, QUARANTINE_RECORD_CHARS),
                          "record_length": pc.utf8_length(record)})
        set_aside.rows += (copy_batches(dsn, set_aside.target, table.to_batches(), slice_of=set_aside.next_slice())
                           if set_aside.target.copy else table.num_rows)
    return copy_batches(dsn, target, rows.filter(fine).drop_columns([admit.WHY, admit.RECORD]).to_batches())


def stage_executors(rows: DataFrame, dsn: str, target: Staging, *, set_aside: SetAside | None = None,
                    label: str = "") -> int:
    """From the executors: as :func:`stage_arrow`, for a frame too big for the driver."""
    from pyspark.sql import functions as F

    if admit.WHY not in rows.columns:
        return copy_dataframe(None, rows, dsn, target)
    if set_aside is not None:
        record = F.col(admit.RECORD)
        bad = rows.where(F.col(admit.WHY).isNotNull()).select(
            F.lit(label).alias("offset"), F.lit(None).cast("string").alias("event_id"),
            F.col(admit.WHY).alias("reason"), F.substring(record, 1, QUARANTINE_RECORD_CHARS).alias("record"),
            F.length(record).alias("record_length"))
        set_aside.rows += (copy_dataframe(None, bad, dsn, set_aside.target, slice_of=set_aside.next_slice())
                           if set_aside.target.copy else bad.count())
    return copy_dataframe(None, rows.where(F.col(admit.WHY).isNull()).drop(admit.WHY, admit.RECORD), dsn, target)


def _copy_arrow(store: StoreFile, target: Staging, batches: Iterable[Any], slice_of: str | None) -> Iterator[Any]:
    import pyarrow as pa

    yield pa.RecordBatch.from_pydict({"n": [copy_batches(store.dsn(), target, batches, slice_of=slice_of)]})


def copy_dataframe(spark: SparkSession | None, df: DataFrame, dsn: str, target: Staging, *,
                   slice_of: str | None = None) -> int:
    """COPY a DataFrame from the executors, in parallel, in Arrow batches; return the rows written.
    The same for a classic session and a Spark Connect one (``spark`` is kept for callers).
    ``slice_of``: as :func:`copy_batches`.

    The COPYing tasks are the job's last stage, whose results (one count each) go straight to the
    driver: summed by Spark instead, they would be shuffle output on the executor, and an executor
    lost before the sum read it would have its COPYs run again (a staging table refuses the second
    copy, failing the attempt; the quarantine keeps one, see :func:`writer_of`). The tasks carry no
    DSN: each executor reads it from the file Spark hands it (:mod:`.handoff`)."""
    store = store_file(df.sparkSession, dsn)
    counts = df.mapInArrow(lambda batches: _copy_arrow(store, target, batches, slice_of), "n long")
    return sum(int(row[0]) for row in counts.collect())
