"""Parsing and validating a batch's records: good ones on, bad ones (with their offset and the
reason, a capped prefix of the raw text and its length) to the quarantine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..core.model import QUARANTINE_RECORD_CHARS
from ..exceptions import ConfigError
from .read import EVENT_ID_COL, OFFSET_COL

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_CORRUPT = "_corrupt_record"


class Validated(NamedTuple):
    good: DataFrame  # the parsed fields (and where each record came from)
    bad: DataFrame  # offset, event_id, reason, record (a capped prefix), record_length
    records: int
    bad_records: int
    cached: DataFrame  # the caller unpersists it when done (a Spark Connect server would keep it)


def validate(df: DataFrame, is_text: bool, schema: str | None, required: Sequence[str]) -> Validated:
    """Split records into good and bad ones, and count both in the one pass that caches the batch.

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
    totals = flat.agg(F.count(F.lit(1)).alias("records"), F.count("_reason").alias("bad")).first()
    assert totals is not None  # a global aggregate has one row
    good = flat.where(F.col("_reason").isNull()).select(OFFSET_COL, EVENT_ID_COL, *fields)
    bad = flat.where(is_bad).select(
        F.coalesce(F.col(OFFSET_COL), F.lit("?")).alias("offset"), F.col(EVENT_ID_COL).alias("event_id"),
        F.col("_reason").alias("reason"), F.col("_record").alias("record"),
        F.col("_record_length").alias("record_length"))
    return Validated(good, bad, int(totals["records"]), int(totals["bad"]), flat)


def spark_schema(ddl: str) -> Any:
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(ddl)
    if not isinstance(schema, StructType) or not schema.fields:
        raise ConfigError(f"record schema {ddl!r} has no fields")
    return schema
