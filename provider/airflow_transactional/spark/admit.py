"""The limits of :mod:`..limits`, as Spark columns: why a record, a folded row, a request or an
output event cannot be staged (null: it can).

Record by record where the helper can tell the records apart (states declared :func:`.fused.per_record`:
the record is quarantined), row by row after a fold otherwise (the key's row of that batch is set
aside, with the reason): nothing that reaches a staging table can fail its COPY, its index, or the
commit's arithmetic. Sums are folded with ``try_sum``, so a batch whose sum for a key leaves the
state's type sets that key aside instead of failing the job (Spark's ANSI arithmetic would).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import limits
from ..exceptions import ConfigError
from ..model import Staging
from ..spec import StateSpec
from ..values import Combiner

if TYPE_CHECKING:
    from pyspark.sql import Column

#: The Spark type each SQL type of a key or a value is staged as.
SPARK_TYPES = {"bigint": "bigint", "integer": "int", "numeric": "decimal(38,10)", "double precision": "double",
               "text": "string", "date": "date", "timestamp with time zone": "timestamp", "boolean": "boolean"}
#: The columns a judged frame carries besides what it stages: the reason, and the row as JSON.
WHY, RECORD = "_why", "_record"


def spark_type(sql_type: str) -> str:
    return SPARK_TYPES.get(sql_type, "string")


@dataclass
class SetAside:
    """Where the rows that cannot be staged go -- the attempt's quarantine (``target``: its COPY with
    topology, txid and attempt as the prefix; an empty COPY: nowhere, only counted, as an audit
    does) -- and how many went."""

    target: Staging
    rows: int = 0
    copies: int = 0

    def next_slice(self) -> str:
        """The name of the attempt's next COPY into the quarantine: each of its rows is written with
        it and its Spark partition, so the commit can tell a slice a task copied twice (see
        the quarantine's ``slice`` column in ``store/schema/0001_first_release.sql``)."""
        self.copies += 1
        return str(self.copies)


def first_reason(reasons: Sequence[tuple[Column, str]]) -> Column:
    """The message of the first condition that holds (null: none does); a null condition holds not."""
    from pyspark.sql import functions as F

    out = F.lit(None).cast("string")
    for condition, message in reversed(reasons):
        out = F.when(F.coalesce(condition, F.lit(False)), F.lit(message)).otherwise(out)
    return out


def key_reasons(what: str, key_types: Mapping[str, str], keys: Mapping[str, Column]) -> list[tuple[Column, str]]:
    """Why non-null ``keys`` (column name -> Column) of ``key_types`` cannot be a key."""
    from pyspark.sql import functions as F

    reasons = []
    texts = []
    for name, sql_type in key_types.items():
        key = keys[name]
        if sql_type == "text":
            text = key.cast("string")
            texts.append(F.coalesce(F.octet_length(text), F.lit(0)))
            reasons.append((F.instr(text, "\u0000") > 0, f"{what} holds a NUL byte (\\u0000), which PostgreSQL "
                                                         "text cannot store"))
        else:
            reasons.append((key.isNotNull() & key.try_cast(spark_type(sql_type)).isNull(),
                            f"{what} ({name}) does not fit {sql_type}"))
    if texts:
        total = texts[0]
        for t in texts[1:]:
            total = total + t
        reasons.append((total > limits.MAX_KEY_BYTES, f"{what} is more than the {limits.MAX_KEY_BYTES:,} bytes "
                                                      "allowed"))
    return reasons


def value_reasons(what: str, sql_type: str, value: Column) -> list[tuple[Column, str]]:
    """Why a non-null ``value`` cannot go into a column of ``sql_type`` (NaN and infinities too)."""
    from pyspark.sql import functions as F

    if sql_type == "text":
        return [(F.instr(value.cast("string"), "\u0000") > 0, f"{what} holds a NUL byte (\\u0000)")]
    reasons = [(value.isNotNull() & value.try_cast(spark_type(sql_type)).isNull(), f"{what} does not fit {sql_type}")]
    if sql_type == "double precision":
        number = value.try_cast("double")
        reasons.append((F.isnan(number) | (F.abs(number) == F.lit(float("inf"))), f"{what} is not a finite number"))
    return reasons


def id_reasons(what: str, ident: Column) -> list[tuple[Column, str]]:
    """Why an id (an event's, a request's) cannot be one."""
    from pyspark.sql import functions as F

    text = ident.cast("string")
    return [(text.isNull() | (text == ""), f"{what} is missing"),
            (F.instr(text, "\u0000") > 0, f"{what} holds a NUL byte (\\u0000)"),
            (F.octet_length(text) > limits.MAX_ID_BYTES,
             f"{what} is more than the {limits.MAX_ID_BYTES} bytes allowed")]


def lone_surrogate(text: Column) -> Column:
    """Whether JSON ``text`` escapes a lone surrogate (:data:`..limits.SURROGATE_PAIRS_AND_BACKSLASHES`:
    escaped backslashes and pairs removed left to right, a surrogate's escape left): looked at
    only when the text holds ``\\u`` at all."""
    from pyspark.sql import functions as F

    return text.contains("\\u") & F.regexp_replace(text, limits.SURROGATE_PAIRS_AND_BACKSLASHES, "").rlike(
        limits.SURROGATE_ESCAPE)


#: What Spark's JSON reader makes of a JSON value that is not text, in a field declared ``string``
#: (a whole number aside: its digits, as the pure-Python processor reads it): a number with a
#: fraction or an exponent, NaN or an infinity (quoted), true, false, an array, an object.
LOOKS_NOT_TEXT = (r'(?s)^(-?[0-9]+(\.[0-9]*([eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+)|"?[-+]?(NaN|INF|Infinity)"?|true|false'
                  r'|\[.*|\{.*)$')
#: The first characters of those (as code points): most texts are passed by this test alone.
_FIRST = (*b'"+-INft[{', *b"0123456789")


def looks_not_text(text: Column) -> Column:
    """Whether ``text``, read from a field declared ``string``, may be a JSON value that was not
    text (:data:`LOOKS_NOT_TEXT`; never for null, text and whole numbers -- ``"1.5"`` or ``"true"``
    given as text look so too, and are told apart by :func:`held_not_text`)."""
    from pyspark.sql import functions as F

    return F.coalesce(F.when(F.ascii(text).isin(*_FIRST), text.rlike(LOOKS_NOT_TEXT)), F.lit(False))


def held_not_text(value: Column) -> Column:
    """Whether the variant ``value`` (a field of a record parsed as a variant) is not text: for a
    value :func:`looks_not_text` picked (never a whole number's digits), any number, boolean, array
    or object is what a field declared ``string`` may not hold (a variant keeps ``-0.0`` as a
    whole ``DECIMAL(1,0)``, so its type cannot tell a whole number apart). Null (unparsed): it is
    not known not to be."""
    from pyspark.sql import functions as F

    return F.schema_of_variant(value) != F.lit("STRING")


def not_text_reason(name: str, text: Column) -> Column:
    """The quarantine's reason for a record whose field ``name``, declared ``string``, held ``text``
    (as Spark's JSON reader made it) that was not JSON text."""
    from pyspark.sql import functions as F

    return F.concat(F.lit(f"field {name!r} must be text (the record schema declares it string), got "),
                    F.substring(text, 1, 80))


def record_reason(state: StateSpec, keys: Mapping[str, Column], value: Column) -> Column:
    """Why one record's row of ``state`` (its keys and value, as :func:`.fused.per_record` declared them)
    cannot be folded: the record is then quarantined with that reason."""
    return first_reason([*key_reasons(f"the key of state {state.name!r}", state.keys, keys),
                   *value_reasons(f"the value for state {state.name!r}", state.value_type, value)])


def fold_columns(state: StateSpec, values: Column, name: str) -> list[Column]:
    """The aggregations that fold a key's ``values`` for ``state``: the value (sums with
    ``try_sum``: null on overflow, never an error) as ``name``, and how many values were not null
    as ``name_n`` (a key whose values were all null contributes nothing)."""
    from pyspark.sql import functions as F

    combiner = Combiner(state.combiner)
    if combiner is Combiner.REPLACE:
        raise ConfigError(f"state {state.name!r}: the Spark helper folds sum, count, min and max; for "
                          "'replace' keep one row per key in the transform and use combiner 'max' on a "
                          "version column, or process with the pure-Python processor")
    agg = {Combiner.MIN: F.min, Combiner.MAX: F.max}.get(combiner, F.try_sum)
    return [agg(values).alias(name), F.count(values).alias(f"{name}_n")]


def judged_fold(state: StateSpec, keys: Mapping[str, Column], value: Column, count: Column) -> list[Column]:
    """A folded row of ``state`` as staged -- its keys and value as the state's types -- and, for one
    that cannot be, :data:`WHY` and :data:`RECORD`. A row whose values were all null is none of these:
    callers drop it (``count`` is 0)."""
    from pyspark.sql import functions as F

    typed = value.try_cast(spark_type(state.value_type))
    why = first_reason([*key_reasons(f"the key of state {state.name!r}", state.keys, keys),
                  ((count > 0) & typed.isNull(), f"the batch's {Combiner(state.combiner).value} for this key leaves "
                                                 f"{state.value_type}: it is set aside (declare value_type='numeric' "
                                                 "for sums that large)"),
                  *value_reasons(f"the batch's value for this key of state {state.name!r}", state.value_type, value)])
    return [*[keys[k].try_cast(spark_type(t)).alias(k) for k, t in state.keys.items()], typed.alias("value"),
            why.alias(WHY), F.when(why.isNotNull(), F.to_json(F.struct(*[keys[k].alias(k) for k in state.keys],
                                                                        value.cast("string").alias("value"))))
            .alias(RECORD)]
