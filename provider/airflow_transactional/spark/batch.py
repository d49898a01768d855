"""One batch read and folded, for every mode of the job: the records read, parsed and judged once,
the transform's frames, each state's fold (all in one pass when the transform declared them per
record) -- and staged into a recomputation's tables (an audit's, a rebuild's, a preview's)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..coordinator import Coordinator
from ..exceptions import ConfigError
from ..model import FileBatch, ReplayBatch, Staging, planned_batch
from ..sources.base import Versions
from ..spec import TopologySpec
from .admit import SetAside
from .fused import FusedFolds, fuse
from .read import EVENT_ID_COL, OFFSET_COL, as_text, raw_records, replayed
from .stage import fold, stage_fold
from .validate import Prepared, cache, prepare

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KEEP_OBSERVATIONS = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"
Transform = Callable[["DataFrame"], Mapping[str, "DataFrame"]]


def transformed(spec: TopologySpec, transform: Transform, good: DataFrame) -> dict[str, DataFrame]:
    """What the transform returned for each state, output and decision -- one for every state
    (but those a decision updates: they get no rows from the transform), none unknown."""
    out = transform(good)
    if not isinstance(out, Mapping):
        raise ConfigError("the transform must return {state name: DataFrame} (and {output name: DataFrame} "
                          "for the topology's outputs, {decision name: DataFrame} for its decisions)")
    # A state the DAG file adds is declared until the owner approves it, a retired one is kept as it
    # was: their rows are not kept; while a state is redefined, its name feeds the new version.
    routes = spec.job_routes
    out = {to: df for name, df in out.items() if (to := routes.get(name, name)) is not None}
    states = spec.folded_states
    others = [o.name for o in spec.outputs] + [d.name for d in spec.decisions]
    unknown = set(out) - {s.name for s in states} - set(others)
    if unknown:
        raise ConfigError(f"the transform returned unknown states or outputs {sorted(unknown)}; the topology has "
                          f"states {', '.join(s.name for s in states)}"
                          + (f" and outputs or decisions {', '.join(others)}" if others else "")
                          + (f" (states {', '.join(sorted(spec.decided_states))} are updated by decisions only)"
                             if spec.decided_states else ""))
    missing = [s.name for s in states if s.name not in out]
    if missing:
        raise ConfigError(f"the transform returned no DataFrame for states {missing}" + spec.redefined_hint(missing))
    return {name: out[name] for name in [*(s.name for s in states), *others] if name in out}


def negating(spark: SparkSession, spec: TopologySpec, transform: Transform, good: DataFrame,
             versions: Versions) -> dict[str, DataFrame]:
    """The transform's frames for a batch holding a correction's events upstream (:class:`Versions`):
    the records that cancel out within the batch left out, retractions and versions read under
    their origin's ``_event_id``; the transform of the other records, and of the retractions with
    each state value negated -- what their events had added, taken back (sum and count states only:
    the core refuses a topology with others, :func:`~airflow_transactional.core.corrections.
    retraction_refusal`) -- and each output event marked as a retraction (``_retraction``) or not."""
    from pyspark.sql import functions as F

    if versions.cancelled:
        cancelled = spark.createDataFrame([(o,) for o in sorted(versions.cancelled)], [OFFSET_COL])
        good = good.join(F.broadcast(cancelled), OFFSET_COL, "left_anti")
    origins = {**versions.versions, **versions.retractions}
    if origins:
        named = spark.createDataFrame(sorted(origins.items()), [OFFSET_COL, "_origin"])
        good = (good.join(F.broadcast(named), OFFSET_COL, "left")
                .withColumn(EVENT_ID_COL, F.coalesce("_origin", EVENT_ID_COL)).drop("_origin"))
    if not versions.retractions:
        return _marked(spec, transformed(spec, transform, good), False)
    offsets = F.broadcast(spark.createDataFrame([(o,) for o in sorted(versions.retractions)], [OFFSET_COL]))
    added = _marked(spec, transformed(spec, transform, good.join(offsets, OFFSET_COL, "left_anti")), False)
    taken = _marked(spec, transformed(spec, transform, good.join(offsets, OFFSET_COL, "left_semi")), True)
    states = {s.name for s in spec.states}
    return {name: df.unionByName(taken[name].withColumn("value", -taken[name]["value"]) if name in states
                                 else taken[name]) for name, df in added.items()}


def _marked(spec: TopologySpec, frames: dict[str, DataFrame], retraction: bool) -> dict[str, DataFrame]:
    """``frames`` with each output's events marked ``_retraction`` (or not)."""
    from pyspark.sql import functions as F

    outputs = {o.name for o in spec.outputs}
    return {name: df.withColumn("_retraction", F.lit(retraction)) if name in outputs else df
            for name, df in frames.items()}


def folded(spec: TopologySpec, frames: Mapping[str, DataFrame]) -> dict[str, DataFrame]:
    """Each state's folded rows, by state; then each output's events and each decision's requests,
    as the transform returned them."""
    states = {s.name for s in spec.folded_states}
    return {name: fold(spec.state(name), df) if name in states else df for name, df in frames.items()}


class Read(NamedTuple):
    """A planned batch read once: the transform's frames, and either every state's fold done in
    that one pass (``folds``, when the transform declared each state per record) or the judged
    batch cached for a job per frame. ``keep`` is what to unpersist when done."""

    prepared: Prepared
    frames: dict[str, DataFrame]
    folds: FusedFolds | None
    keep: DataFrame
    records: int
    bad_records: int


def read_batch(spark: SparkSession, coordinator: Coordinator, spec: TopologySpec, batch: Mapping[str, Any],
          transform: Transform, *, schema: str | None, required: Sequence[str], checks: Mapping[str, str] | None,
          states: Collection[str] | None = None) -> Read:
    """Read, parse and judge the planned ``batch`` of ``spec``, and count it; the transform's frames
    (only those of ``states`` when given: an audit or a rebuild recomputes states -- outputs stay
    appended, and a decision's verdicts cannot be recomputed in parallel -- and a state's build
    only that state)."""
    # The batch is counted by observations of the job that reads it; when every record is bad
    # (or set aside) the fold's input is empty, and this rule would cut the job short before the
    # observations report -- no count, and a job that fails for a batch of garbage.
    spark.conf.set("spark.sql.adaptive.optimizer.excludedRules", KEEP_OBSERVATIONS)
    versions = (coordinator.versions(spec.topology_id, planned_batch(batch, spec.source.kind))
                if spec.source.may_retract else Versions())
    if isinstance(batch, ReplayBatch):  # quarantined records, from the store
        records = replayed(spark, coordinator.replay_records(spec.topology_id, batch))
    else:
        records = raw_records(spark, spec.source, batch, dsn=coordinator.dsn, schema=coordinator.schema,
                              topology_id=spec.topology_id, record_schema=schema,
                              retractions=frozenset(versions.retractions))
    prepared = prepare(records, schema, required, checks)
    frames = (negating(spark, spec, transform, prepared.good, versions) if versions
              else transformed(spec, transform, prepared.good))
    if states is not None:
        frames = {name: frames[name] for name in states}
    folds = fuse([s for s in spec.folded_states if s.name in frames], frames, prepared.good)
    keep = folds.run() if folds is not None else cache(prepared).cached
    if prepared.unsure() and isinstance(batch, FileBatch) and any(f.get("plain") for f in batch.files):
        # A string field of a line Spark's JSON reader parsed may have held a number: read the
        # files as text, where that shows (once: a batch as text has no plain file).
        keep.unpersist()
        return read_batch(spark, coordinator, spec, as_text(batch), transform, schema=schema, required=required,
                     checks=checks, states=states)
    return Read(prepared, frames, folds, keep, *prepared.totals())


def stage_states(spec: TopologySpec, read: Read, dsn: str, copies: Mapping[str, str],
                  prefix: Sequence[Any]) -> int:
    """COPY every state's fold of ``read`` (an audit's or a rebuild's) with ``copies``; the records
    and folded rows that could not be (what the commits set aside), counted."""
    set_aside = SetAside(Staging(""))
    if read.folds is not None:
        read.folds.stage(dsn, copies, prefix, set_aside)
        return set_aside.rows + read.folds.rejected_count
    for name, df in folded(spec, read.frames).items():
        if name in copies:  # a recomputation's target may take some of the states
            stage_fold(df, dsn, Staging(copies[name], tuple(prefix)), set_aside=set_aside)
    return set_aside.rows
