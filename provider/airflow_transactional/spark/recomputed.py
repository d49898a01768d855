"""The job's recomputations of committed txids, run by ``airflow-txn``: ``--audit`` (every state over
the committed offsets, diffed against the tables), ``--rebuild`` (the same, swapped in while the
topology keeps committing), ``--preview`` (txids A..B under the code deployed now: what a
correction of them would change, and whether the same code computes the same -- its determinism)
and ``--verify`` (a round of the shadow audit: the next committed txids, each recomputed and
checked against its commit, ``core/verify.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import faults, provenance
from ..coordinator import Coordinator
from ..exceptions import TransactionalError
from ..model import VERIFY_ATTEMPT, Staging, read_digest
from ..spec import TopologySpec
from .admit import SetAside
from .batch import Read, Transform, read_batch, stage_states
from .profile import Phases
from .read import readable_batch
from .stage import output_events, stage_fold

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def audit(spark: SparkSession, coordinator: Coordinator, topology_id: str, transform: Transform,
          *, schema: str | None, required: Sequence[str], checks: Mapping[str, str] | None = None
          ) -> dict[str, Any]:
    """Recompute every state from the source over the committed offsets and diff the tables. Where
    the source no longer holds what committed txids read, from the verified-through mark: the states
    as of it from their delta history (every txid through it checked before its input went), and the
    txids after it recomputed from the source (``core/audit_base.audit_base``)."""
    for _ in range(3):
        spec = coordinator.spec(topology_id)
        st = coordinator.status(topology_id)
        batch, why_not = coordinator.committed_batch(topology_id)
        base = coordinator.audit_base(topology_id) if why_not else {}
        if "refused" in base:
            return {"topology": topology_id, "auditable": False, "reason": f"{why_not}; {base['refused']}",
                    "differences": None}
        num, copies = coordinator.audit_tables(topology_id)
        n_bad = 0
        if not base or base["records"]:
            batch, unreadable = readable_batch(base.get("batch", batch), spec.source)
            read = read_batch(spark, coordinator, spec, batch, transform, schema=schema, required=required,
                              checks=checks, states_only=True)
            n_bad = read.bad_records + len(unreadable) + stage_states(spec, read, coordinator.dsn, copies, ())
            read.keep.unpersist()
        n_bad += with_replays(spark, coordinator, spec, "audit", base.get("txid", 0), st.committed_txid, transform,
                              schema=schema, required=required, checks=checks)
        if base:
            coordinator.add_audit_base(topology_id, num, base["txid"])
            n_bad += base["quarantined"]
        result = coordinator.diff_audit(topology_id, num, st.committed_txid)
        if result is None:  # a commit landed meanwhile: recompute against the new checkpoint
            continue
        if base:
            result["from_verified_txid"] = base["txid"]
        result["quarantined_recomputed"] = n_bad
        result["quarantined_committed"] = st.quarantined
        if n_bad != st.quarantined:
            result["differences"] += abs(n_bad - st.quarantined)
            result["samples"].append(f"quarantine: {st.quarantined} committed, {n_bad} recomputed")
        return result
    raise TransactionalError(f"topology {topology_id!r} kept committing during the audit: pause it and rerun")


def with_replays(spark: SparkSession, coordinator: Coordinator, spec: TopologySpec, purpose: str, after: int,
                 through: int, transform: Transform, *, schema: str | None, required: Sequence[str],
                 checks: Mapping[str, str] | None) -> int:
    """Fold into the recomputation of ``purpose`` what the replays committed after txid ``after``
    through ``through`` counted -- the records they took, each as edited (``core/replayed.py``) --
    and return the bad records that adds: those still bad, less the records the replays took."""
    batch = coordinator.committed_replays(spec.topology_id, after + 1, through)
    if batch is None:
        return 0
    copies = coordinator.replay_copies(spec.topology_id, purpose)
    read = read_batch(spark, coordinator, spec, batch, transform, schema=schema, required=required, checks=checks,
                      states_only=True)
    n_bad = read.bad_records + stage_states(spec, read, coordinator.dsn, copies, ())
    read.keep.unpersist()
    coordinator.fold_in_replays(spec.topology_id, purpose)
    return n_bad - len(batch.replay)


def rebuild(spark: SparkSession, coordinator: Coordinator, topology_id: str, transform: Transform,
            *, schema: str | None, required: Sequence[str], checks: Mapping[str, str] | None = None
          ) -> dict[str, Any]:
    """Recompute every state from the source and swap it in while the topology keeps committing."""
    started = coordinator.begin_rebuild(topology_id)
    try:
        spec = coordinator.spec(topology_id)
        batch, why_not = coordinator.committed_batch(topology_id, through_txid=started.through_txid)
        if why_not:
            raise TransactionalError(f"topology {topology_id!r} cannot be rebuilt from its source: {why_not}")
        read = read_batch(spark, coordinator, spec, readable_batch(batch, spec.source)[0], transform, schema=schema,
                     required=required, checks=checks, states_only=True)
        stage_states(spec, read, coordinator.dsn, coordinator.rebuild_copies(topology_id), ())
        read.keep.unpersist()
        with_replays(spark, coordinator, spec, "rebuild", 0, started.through_txid, transform, schema=schema,
                     required=required, checks=checks)
        faults.point("rebuild.loaded", scope=(topology_id,))
        return coordinator.swap_rebuild(started)
    except BaseException:
        coordinator.abort_rebuild(topology_id, started=started)
        raise


def preview(spark: SparkSession, coordinator: Coordinator, topology_id: str, transform: Transform,
            *, txids: tuple[int, int], schema: str | None, required: Sequence[str],
            checks: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Recompute committed txids first..last under this code: what a correction of them would apply
    per state (keys changed, totals, the largest changes) and append to each output (retractions,
    new versions), and whether the same code computed something else (non-determinism). Nothing is
    committed."""
    first, last = txids
    spec = coordinator.spec(topology_id)
    batch = coordinator.correction_batch(topology_id, first, last)
    read = read_batch(spark, coordinator, spec, readable_batch(batch, spec.source)[0], transform, schema=schema,
                      required=required, checks=checks, states_only=not spec.outputs)
    num, copies = coordinator.audit_tables(topology_id, outputs=True)
    if spec.outputs:  # staged as a commit's would be, under (txid 0, attempt 0)
        read = _stage_events(coordinator, spec, read, copies[""], (0, 0))[0]
    stage_states(spec, read, coordinator.dsn, copies, ())
    read.keep.unpersist()
    code = provenance.code(spec.to_config(), application=provenance.application_digest(transform))
    return coordinator.preview_correction(topology_id, num, first, last, code)


def verify(spark: SparkSession, coordinator: Coordinator, topology_id: str, transform: Transform,
           *, budget: int, every: int, schema: str | None, required: Sequence[str],
           checks: Mapping[str, str] | None = None, phases: Phases | None = None) -> dict[str, Any]:
    """A round of the shadow audit: each txid it takes read again as its batch was planned,
    folded by this code, staged under the verification attempt and judged against its commit."""
    spec = coordinator.spec(topology_id)
    code = provenance.code(spec.to_config(), application=provenance.application_digest(transform))
    copies = coordinator.staging_copies(topology_id, verify=True)  # the round's own tables
    out_copy = coordinator.output_staging(topology_id, verify=True).copy if spec.outputs else ""
    checked = []
    phases = phases or Phases()
    with coordinator.verifying(topology_id, budget=budget, every=every, code=code) as rnd:
        phases.lap("plan the round")
        for task in rnd.tasks:
            batch, unreadable = readable_batch(task.batch, spec.source)
            read = read_batch(spark, coordinator, spec, batch, transform, schema=schema, required=required,
                              checks=checks, states_only=not spec.outputs)
            phases.lap("read, parse, validate, fold")
            set_aside = 0
            if spec.outputs and task.kind == "batch":  # a correction's events are its compensation: not checked
                read, set_aside = _stage_events(coordinator, spec, read, out_copy, (task.txid, VERIFY_ATTEMPT))
            set_aside += stage_states(spec, read, coordinator.dsn, copies, (task.txid, VERIFY_ATTEMPT))
            read.keep.unpersist()
            phases.lap("stage")
            checked.append(coordinator.verify_judge(
                topology_id, task, quarantined=read.bad_records + len(unreadable) + set_aside,
                read_digest=read_digest(read.records, read.prepared.offset_crcs())))
            phases.lap("judge")
    mark = checked[-1]["verified_through"] if checked else coordinator.verify_status(topology_id)["verified_through"]
    return {"topology": topology_id, "busy": rnd.busy, "settled": rnd.settled, "checked": checked,
            "verified_through": mark}


def _stage_events(coordinator: Coordinator, spec: TopologySpec, read: Read, copy: str, key: tuple[int, int]
                  ) -> tuple[Read, int]:
    """Stage the output events ``read`` holds with ``copy`` under ``key`` (txid, attempt), as the
    process task stages them; the read without them (its states), and the rows set aside."""
    set_aside = SetAside(Staging(""))
    partitions = coordinator.output_staging(spec.topology_id).partitions
    for o in spec.outputs:
        events = output_events(spec.topology_id, o.name, partitions[o.name], read.frames[o.name],
                               [d.name for d in spec.decisions], txid=key[0])
        stage_fold(events, coordinator.dsn, Staging(copy, (*key, o.name)), set_aside=set_aside)
    return read._replace(frames={s.name: read.frames[s.name] for s in spec.recomputable_states}), set_aside.rows
