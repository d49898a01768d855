"""Parsing and validating a batch's records: good ones on, bad ones (with their offset and the
reason, a capped prefix of the raw text and its length) to the quarantine -- judged lazily
(:func:`prepare`), then cached for several passes (:func:`cache`) or read once by a fused fold."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from .. import limits
from ..exceptions import ConfigError
from ..limits import QUARANTINE_RECORD_CHARS
from . import admit
from .read import (
    COLUMNS,
    CORRUPT_COL,
    EVENT_ID_COL,
    INVALID_COL,
    NEEDS_SCHEMA,
    OFFSET_COL,
    PARSED,
    TEXT,
    Records,
    spark_schema,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation
    from pyspark.sql.types import StructType

__all__ = ["Prepared", "Validated", "cache", "prepare", "spark_schema", "validate"]


class Prepared(NamedTuple):
    """A batch parsed and judged, not read yet: every record with its verdict (``flat``), the good
    ones, the bad ones, and the observation that counts both in the first job that reads the
    whole batch (a fold, or :func:`cache`)."""

    flat: DataFrame  # fields, _reason, and for bad records the raw text (a capped prefix) and its length
    good: DataFrame  # the parsed fields (and where each record came from)
    bad: DataFrame  # offset, event_id, reason, record (a capped prefix), record_length
    counts: Observation

    def totals(self) -> tuple[int, int]:
        """(records, bad records), once a job has read the whole batch."""
        metrics = self.counts.get
        return int(metrics["records"]), int(metrics["bad"])

    def unsure(self) -> int:
        """How many records Spark's JSON reader parsed (:data:`.read.PARSED`) with a field declared
        ``string`` that may have held another JSON value (:func:`.admit.looks_not_text`), once a
        job has read the whole batch: only their raw text tells, so the batch is read as text."""
        return int(self.counts.get["unsure"] or 0)

    def offset_crcs(self) -> int:
        """The sum of the CRC-32s of the records' offsets, once a job has read the whole batch:
        with the count, which records were read (:func:`..model.read_digest`)."""
        metrics = self.counts.get
        return (int(metrics["crcs_high"] or 0) << 16) + int(metrics["crcs_low"] or 0)


class Validated(NamedTuple):
    good: DataFrame  # the parsed fields (and where each record came from)
    bad: DataFrame  # offset, event_id, reason, record (a capped prefix), record_length
    records: int
    bad_records: int
    cached: DataFrame  # the caller unpersists it when done (a Spark Connect server would keep it)


def validate(records: Records, schema: str | None, required: Sequence[str],
             checks: Mapping[str, str] | None = None) -> Validated:
    """:func:`prepare` and :func:`cache`: the batch judged, cached and counted."""
    return cache(prepare(records, schema, required, checks))


def cache(prepared: Prepared) -> Validated:
    """Cache the judged batch (memory, then disk) for the passes that follow -- the quarantine and
    one fold per state -- and count its good and bad records in the pass that fills the cache.

    Records are parsed once, and the cache holds the raw record only for bad ones. (Caching the raw
    text instead re-parsed every JSON payload in every pass.)
    """
    from pyspark import StorageLevel

    flat = prepared.flat.persist(StorageLevel.MEMORY_AND_DISK)
    flat.count()  # fills the cache; the batch's observation counts its records in the same pass
    return Validated(prepared.good, prepared.bad, *prepared.totals(), flat)


def _flatten(records: Records, declared: StructType | None) -> tuple[DataFrame, list[str], list[str], Column]:
    """The batch as columns: (the records with ``_malformed`` and, for text, ``_invalid``; the
    record schema's fields (``declared``); what the reader adds besides them; the raw record of each)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    df = records.df
    if records.form == TEXT:
        if declared is None:
            raise ConfigError(NEEDS_SCHEMA)
        parsed_schema = StructType([*declared.fields, StructField(CORRUPT_COL, StringType())])
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COL}
        # A record over the limit is never parsed (nor held longer than its check and quarantine need).
        fits = F.octet_length("payload") <= limits.MAX_RECORD_BYTES
        parsed = df.withColumn("_r", F.from_json(F.when(fits, F.col("payload")), parsed_schema, options))
        fields = [f.name for f in parsed_schema.fields if f.name != CORRUPT_COL]
        # What the reader knows of a record besides its text (a Kafka record's partition, key...).
        meta = [c for c in df.columns if c not in (OFFSET_COL, EVENT_ID_COL, "payload", INVALID_COL, *fields)]
        invalid = F.col(INVALID_COL) if INVALID_COL in df.columns else F.lit(None).cast("string")
        # A payload that is not a JSON object (or not JSON at all) parses to nothing at all.
        malformed = F.col(f"_r.{CORRUPT_COL}").isNotNull() | F.col("_r").isNull()
        flat = parsed.select(OFFSET_COL, EVENT_ID_COL, "payload", *[F.col(f"_r.{f}").alias(f) for f in fields],
                             *meta, malformed.alias("_malformed"), invalid.alias(INVALID_COL))
        record = F.coalesce(F.col("payload"), F.lit(""))
    elif records.form == PARSED:
        meta = []
        fields = [c for c in df.columns if c not in (OFFSET_COL, EVENT_ID_COL, CORRUPT_COL)]
        flat = df.withColumn("_malformed", F.col(CORRUPT_COL).isNotNull())
        record = F.coalesce(F.col(CORRUPT_COL), F.to_json(F.struct(*[F.col(c) for c in fields])))
    elif records.form == COLUMNS:
        meta = []
        fields = [c for c in df.columns if c not in (OFFSET_COL,)]
        flat = df.withColumn(EVENT_ID_COL, F.lit(None).cast("string")).withColumn("_malformed", F.lit(False))
        record = F.to_json(F.struct(*[F.col(c) for c in fields]))
    else:
        raise ConfigError(f"a reader returned records of unknown form {records.form!r}: use {TEXT}, {PARSED} or "
                          f"{COLUMNS}")
    return flat, fields, meta, record


def _text_fields(declared: StructType | None, fields: Sequence[str]) -> list[str]:
    """The fields the record schema declares ``string`` that Spark's JSON reader filled (``declared``
    is None for a Parquet or CSV file's columns: they are what they are)."""
    from pyspark.sql.types import StringType

    if declared is None:  # no schema, or a Parquet or CSV file's own columns
        return []
    return [f.name for f in declared.fields if isinstance(f.dataType, StringType) and f.name in fields]


def _text_reason(payload: Column) -> Column:
    """Why a raw record of a TEXT reader is bad before it is parsed, as the pure-Python processor
    judges it (:func:`..limits.record_refusal`): the reader's verdict, then the record limits."""
    from pyspark.sql import functions as F

    return (F.when(F.col(INVALID_COL).isNotNull(), F.col(INVALID_COL))
            .when(F.octet_length(payload) > limits.MAX_RECORD_BYTES, F.lit(limits.RECORD_TOO_LARGE))
            .when(admit.lone_surrogate(payload), F.lit(limits.LONE_SURROGATE)))


def prepare(records: Records, schema: str | None, required: Sequence[str],
            checks: Mapping[str, str] | None = None) -> Prepared:
    """Parse records and judge each one: a bad one gets the reason, and its raw text for the
    quarantine. Nothing is read yet; the first job that reads the batch also counts it.

    The raw record is the text as read, except for a record Spark's JSON reader parsed but that
    lacks a required field: that one is kept as its parsed fields, in JSON.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    declared = spark_schema(schema) if schema and records.form in (TEXT, PARSED) else None  # parsed once
    flat, fields, meta, record = _flatten(records, declared)
    unknown = [r for r in required if r not in fields]
    if unknown:
        raise ConfigError(f"required fields {unknown} are not in the record schema ({', '.join(fields)})")
    not_json = F.lit("malformed record: not a JSON object of the schema")
    reason = (_text_reason(F.col("payload")).when(F.col("_malformed"), not_json)
              if records.form == TEXT else F.when(F.col("_malformed"), not_json))
    texts = _text_fields(declared, fields)
    if records.form == TEXT and texts:
        # Spark's reader makes any JSON value text in a field declared string; the record's text
        # tells which held another value -- parsed again only for a record where one may have.
        as_variants = ", ".join(f"`{f.replace('`', '``')}` variant" for f in texts)
        held = F.from_json(F.col("payload"), as_variants, {"mode": "PERMISSIVE"})
        for f in texts:
            reason = reason.when(admit.looks_not_text(F.col(f)) & admit.held_not_text(held[f]),
                                 admit.not_text_reason(f, F.col(f)))
    for r in required:
        reason = reason.when(F.col(r).isNull(), F.lit(f"missing required field {r!r}"))
    for why, condition in (checks or {}).items():
        if not isinstance(why, str) or not isinstance(condition, str):
            raise ConfigError(f"checks map a reason to a Spark SQL condition, e.g. {{'amount must be positive': "
                              f"'amount > 0'}}; got {why!r}: {condition!r}")
        reason = reason.when(~F.coalesce(F.expr(condition), F.lit(False)), F.lit(why))
    flat = flat.withColumn("_reason", reason)
    # Only a prefix of a bad record is kept (and its length): a poison record of any size costs
    # the quarantine QUARANTINE_RECORD_CHARS characters.
    is_bad = F.col("_reason").isNotNull()
    flat = (flat.withColumn("_record", F.when(is_bad, F.substring(record, 1, QUARANTINE_RECORD_CHARS)))
            .withColumn("_record_length", F.when(is_bad, F.length(record)))
            .select(OFFSET_COL, EVENT_ID_COL, *fields, *meta, "_reason", "_record", "_record_length"))
    counts = Observation(f"airflow_transactional_records_{uuid.uuid4().hex}")  # unique in any plan
    # The CRC-32s' sum as two sums of bigints (their high and low 16 bits): exact up to 2^47
    # records, without a decimal per record.
    crc = F.crc32(F.col(OFFSET_COL).cast("binary"))
    unsure = F.lit(False)
    if records.form == PARSED:
        for f in texts:
            unsure = unsure | admit.looks_not_text(F.col(f))
    flat = flat.observe(counts, F.count(F.lit(1)).alias("records"), F.count("_reason").alias("bad"),
                        F.count(F.when(unsure, 1)).alias("unsure"),
                        F.sum(F.shiftright(crc, 16)).alias("crcs_high"),
                        F.sum(crc.bitwiseAND(0xFFFF)).alias("crcs_low"))
    good = flat.where(F.col("_reason").isNull()).select(OFFSET_COL, EVENT_ID_COL, *fields, *meta)
    bad = flat.where(is_bad).select(
        F.coalesce(F.col(OFFSET_COL), F.lit("?")).alias("offset"), F.col(EVENT_ID_COL).alias("event_id"),
        F.col("_reason").alias("reason"), F.col("_record").alias("record"),
        F.col("_record_length").alias("record_length"))
    return Prepared(flat, good, bad, counts)

