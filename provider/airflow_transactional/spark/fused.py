"""Folding every state of a batch in one pass over it.

A transform returns each state's rows as a DataFrame; Spark cannot tell that two of them read the
same records, so each state costs a job of its own over a cached copy of the batch. A state
declared per record (:func:`per_record`: its keys, value and condition as expressions of one
record) says more: when every state is declared so, each record becomes one row per state
(tagged with the state) in a single projection, and one aggregation folds them all -- the batch
is read, parsed and judged once, by one job, and never cached. The records and bad records are
counted in the same job (:class:`~.validate.Prepared`); the bad ones are read again only for the
quarantine of a batch that has some.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError
from ..limits import QUARANTINE_RECORD_CHARS
from ..model import Staging
from ..spec import StateSpec
from . import admit
from .admit import SetAside
from .read import EVENT_ID_COL, OFFSET_COL
from .stage import DRIVER_STAGE_ROWS, stage_arrow, stage_executors

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["FusedFolds", "PerRecord", "declared", "fuse", "per_record"]

TAG = "_state"  # which state a folded row belongs to: its index in FusedFolds.states
REJECT = "_reject"  # why a record can be folded into no state (null: it can)


@dataclass(frozen=True)
class PerRecord:
    """A state's rows declared per record: ``where`` (or every record) gives one row of ``keys``
    and ``value``, all expressions of a record of ``records``."""

    records: DataFrame
    keys: dict[str, Column]
    value: Column
    where: Column | None


#: What per_record returned, by id: (a weak reference to the DataFrame, how it was declared).
_DECLARED: dict[int, tuple[weakref.ref[Any], PerRecord]] = {}


def _column(value: Any, what: str) -> Column:
    """A Column given as one, a column name, or a literal (numbers and booleans)."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    if isinstance(value, Column):
        return value
    if isinstance(value, str):
        return F.col(value)
    if isinstance(value, bool | int | float | Decimal):
        return F.lit(value)
    raise ConfigError(f"per_record: {what} must be a Column, a column name or a number, got {value!r}")


def per_record(records: DataFrame, keys: Mapping[str, Any], value: Any = 1, where: Any = None) -> DataFrame:
    """A state's rows, one per record of ``records`` that meets ``where``: the ``keys`` (name ->
    Column or column name) and ``value`` (a Column, a column name, or a number; 1 counts records).

    Returns the DataFrame a transform returns for a state (the keys' columns and ``value``), so a
    transform written with it is still a plain ``DataFrame -> DataFrame`` function. When every
    state a transform returns is declared this way over the records it was given, the helper
    folds them all in one pass over the batch instead of one job per state over a cached copy::

        url = F.col("url")
        return {"url_counts": per_record(tweets, {"url": url}),
                "domain_counts": per_record(tweets, {"domain": domain(url)}, where=domain(url) != "")}
    """
    if not isinstance(keys, Mapping) or not keys or not all(isinstance(k, str) and k for k in keys):
        raise ConfigError(f"per_record: keys maps each key column's name to its Column, e.g. "
                          f"{{'url': F.col('url')}}; got {keys!r}")
    if "value" in keys:
        raise ConfigError("per_record: 'value' names the value column; give the state's keys other names")
    declared_keys = {name: _column(col, f"key {name!r}") for name, col in keys.items()}
    value_col = _column(value, "value")
    condition = None if where is None else _condition(where)
    rows = records if condition is None else records.where(condition)
    out = rows.select(*[col.alias(name) for name, col in declared_keys.items()], value_col.alias("value"))
    for stale in [k for k, (ref, _) in _DECLARED.items() if ref() is None]:
        del _DECLARED[stale]
    _DECLARED[id(out)] = (weakref.ref(out), PerRecord(records, declared_keys, value_col, condition))
    return out


def _condition(where: Any) -> Column:
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    if isinstance(where, Column):
        return where
    if isinstance(where, str):
        return F.expr(where)
    raise ConfigError(f"per_record: where must be a Column or a Spark SQL condition, got {where!r}")


def declared(df: Any) -> PerRecord | None:
    """How ``df`` was declared by :func:`per_record`, or None for any other DataFrame."""
    entry = _DECLARED.get(id(df))
    return entry[1] if entry is not None and entry[0]() is df else None


def fuse(states: Sequence[StateSpec], frames: Mapping[str, DataFrame], records: DataFrame) -> FusedFolds | None:
    """The states' folds as one pass over ``records``, when every frame of ``frames`` (by state name,
    one per state of ``states``) was declared per record over ``records`` itself; else None."""
    plan = []
    for state in states:
        decl = declared(frames.get(state.name))
        if decl is None or decl.records is not records:
            return None
        missing = [k for k in state.key_columns if k not in decl.keys]
        if missing:
            raise ConfigError(f"the transform's DataFrame for state {state.name!r} lacks columns {missing}: it must "
                              f"have {', '.join(state.key_columns)} and value (has {', '.join(decl.keys)}, value)")
        plan.append((state, decl))
    return FusedFolds(records, plan) if plan and len(plan) == len(frames) else None


class FusedFolds:
    """Every state's fold of one batch, computed in one pass (:meth:`run`) and staged per state
    (:meth:`stage`).

    Each record of the batch becomes up to one row per state -- the state's tag, its keys and
    value, the other states' columns null -- and one aggregation by (tag, every state's keys)
    folds each state's rows with its own combiner: what :func:`~.stage.fold` gives state by state.
    A record one of whose rows cannot be folded (:func:`.admit.record_reason`: a key too long or
    holding a NUL, a value its type cannot hold) is folded into no state: it is quarantined, with
    the reason (:attr:`rejected`, counted by the same pass in :attr:`rejected_count`).
    """

    def __init__(self, records: DataFrame, plan: Sequence[tuple[StateSpec, PerRecord]]) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        self.states = [state for state, _ in plan]
        exprs = {(i, n): decl.keys[k] for i, (state, decl) in enumerate(plan) for n, k in enumerate(state.key_columns)}
        # Each key, value and condition computed once per record, as a column: what judges a record
        # and what folds it read these columns. (Written out in both, an expression would run in
        # each, and again in every branch that names it -- `words`' domain regex six times a record.)
        once = [*[e.alias(_key(i, n)) for (i, n), e in exprs.items()],
                *[decl.value.alias(_value(i)) for i, (_, decl) in enumerate(plan)],
                *[(F.lit(True) if decl.where is None else F.coalesce(decl.where, F.lit(False))).alias(_where(i))
                  for i, (_, decl) in enumerate(plan)]]
        projected = records.select(*once)
        rows, reasons = self._rows_and_reasons(list(exprs), {f.name: f.dataType for f in projected.schema.fields})
        self._observed = Observation(f"airflow_transactional_rejected_{uuid.uuid4().hex}")
        checked = projected.withColumn(REJECT, reasons).observe(self._observed,
                                                                F.count(F.col(REJECT)).alias("rejected"))
        fields = [c for c in records.columns if c not in (OFFSET_COL, EVENT_ID_COL)]
        record = F.to_json(F.struct(*[F.col(c) for c in fields]))
        offset = F.col(OFFSET_COL) if OFFSET_COL in records.columns else F.lit(None).cast("string")
        event_id = F.col(EVENT_ID_COL) if EVENT_ID_COL in records.columns else F.lit(None).cast("string")
        self.rejected = records.select("*", *once).withColumn(REJECT, reasons).where(F.col(REJECT).isNotNull()).select(
            F.coalesce(offset, F.lit("?")).alias("offset"), event_id.alias("event_id"),
            F.col(REJECT).alias("reason"), F.substring(record, 1, QUARANTINE_RECORD_CHARS).alias("record"),
            F.length(record).alias("record_length"))
        tagged = (checked.where(F.col(REJECT).isNull()).select(F.explode(F.array(*rows)).alias("_row"))
                  .where(F.col("_row").isNotNull()).select("_row.*"))
        folded = tagged.groupBy(TAG, *[_key(i, n) for i, n in exprs]).agg(
            *[c for i, state in enumerate(self.states) for c in admit.fold_columns(state, F.col(_value(i)), _value(i))])
        self.folded = folded.select(TAG, *[c for i, state in enumerate(self.states) for c in self._judged(i, state)])
        self._head: Any = None

    def _rows_and_reasons(self, keys: Sequence[tuple[int, int]],
                          types: Mapping[str, Any]) -> tuple[list[Column], Column]:
        """From the columns each record's keys, values and conditions were computed into (``keys``:
        (state, n) of each key column; ``types``: every column's type): each state's row of a
        record (null: none), and why the record can be folded into no state (null: it can)."""
        from pyspark.sql import functions as F

        owned = [*((j, _key(j, n)) for j, n in keys), *((j, _value(j)) for j in range(len(self.states)))]
        rows, reasons = [], []
        for i, state in enumerate(self.states):
            keep = F.col(_where(i))
            for n in range(len(state.key_columns)):  # a row without all its keys is never folded
                keep = keep & F.col(_key(i, n)).isNotNull()
            columns = [F.lit(i).alias(TAG)]
            for owner, name in owned:
                # The other states' columns as typed nulls: one struct type for every state's rows.
                columns.append((F.col(name) if owner == i else F.lit(None).cast(types[name])).alias(name))
            rows.append(F.when(keep, F.struct(*columns)))
            state_keys = {k: F.col(_key(i, n)) for n, k in enumerate(state.key_columns)}
            reasons.append(F.when(keep, admit.record_reason(state, state_keys, F.col(_value(i)))))
        return rows, F.coalesce(*reasons)

    @staticmethod
    def _judged(i: int, state: StateSpec) -> list[Column]:
        """State ``i``'s judged columns of a folded row (:func:`.admit.judged_fold`), named for it."""
        from pyspark.sql import functions as F

        keys = {k: F.col(_key(i, n)) for n, k in enumerate(state.key_columns)}
        judged = admit.judged_fold(state, keys, F.col(_value(i)), F.col(f"{_value(i)}_n"))
        names = [*(_key(i, n) for n in range(len(keys))), _value(i), f"{admit.WHY}{i}", f"{admit.RECORD}{i}"]
        return [c.alias(name) for c, name in zip(judged, names, strict=True)] + [F.col(f"{_value(i)}_n")]

    @property
    def rejected_count(self) -> int:
        """How many records :meth:`run` found that no state could fold (their rows are in :attr:`rejected`)."""
        return int(self._observed.get["rejected"])

    def _rows(self, i: int) -> list[str]:
        return [_key(i, n) for n in range(len(self.states[i].key_columns))] + [_value(i), f"{admit.WHY}{i}",
                                                                               f"{admit.RECORD}{i}"]

    def run(self, driver_rows: int = DRIVER_STAGE_ROWS) -> DataFrame:
        """Read the batch and fold every state: the one job that reads it. The folded rows are kept
        (memory, then disk) for :meth:`stage`; returns what the caller unpersists when done. Up to
        ``driver_rows`` rows in all are also brought to the driver, to be staged from there."""
        from pyspark import StorageLevel

        self.folded = self.folded.persist(StorageLevel.MEMORY_AND_DISK_DESER)
        head = self.folded.limit(driver_rows + 1).toArrow()
        self._head = head if head.num_rows <= driver_rows else None
        return self.folded

    def stage(self, dsn: str, copies: Mapping[str, str], prefix: Sequence[Any],
              set_aside: SetAside | None = None) -> dict[str, int]:
        """COPY each state's folded rows (keys, value) with ``copies[state name]`` and ``prefix``
        (:class:`~airflow_transactional.model.Staging`): from the driver
        what :meth:`run` brought there, else from the executors; the rows written per state. A row
        that cannot be staged goes to ``set_aside``."""
        from pyspark.sql import functions as F

        written = {}
        for i, state in enumerate(self.states):
            if state.name not in copies:  # a recomputation's target may take some of the states
                continue
            names = [*state.key_columns, "value", admit.WHY, admit.RECORD]
            label, target = f"fold:{state.name}", Staging(copies[state.name], tuple(prefix))
            if self._head is not None:
                import pyarrow.compute as pc

                mine = pc.and_(pc.equal(self._head[TAG], i), pc.greater(self._head[f"{_value(i)}_n"], 0))
                rows = self._head.filter(mine).select(self._rows(i)).rename_columns(names)
                written[state.name] = stage_arrow(rows, dsn, target, set_aside=set_aside, label=label)
            else:
                rows_df = self.folded.where((F.col(TAG) == i) & (F.col(f"{_value(i)}_n") > 0)).select(
                    *[F.col(c).alias(n) for c, n in zip(self._rows(i), names, strict=True)])
                written[state.name] = stage_executors(rows_df, dsn, target, set_aside=set_aside, label=label)
        return written


def _key(state: int, n: int) -> str:
    return f"_k{state}_{n}"


def _value(state: int) -> str:
    return f"_v{state}"


def _where(state: int) -> str:
    return f"_w{state}"
