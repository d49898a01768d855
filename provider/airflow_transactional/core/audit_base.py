"""Where a whole-history audit starts when the source's retention removed what early txids read: the
shadow audit's verified-through mark (:mod:`.verify`), each txid through it checked before its input
went, and each state as of the mark taken from its delta history."""

from __future__ import annotations

import itertools
from typing import Any

import psycopg2.extensions

from ..model import PlannedBatch, Transaction
from ..spec import TopologySpec
from ..store import corrections as cq
from ..store import history as h
from ..store import state as q
from ..store import verifications as v
from ..values import Combiner
from .context import StateStore
from .reread import merged_batch


def audit_base(store: StateStore, topology_id: str) -> dict[str, Any]:
    """Where a whole-history audit starts when the source no longer holds what committed txids read:
    the verified-through mark -- every txid through it recomputed and checked before its input went
    -- if the source still holds every txid after it and no correction after it reaches back before
    it. ``{"txid": the mark, "batch": the later txids' batches merged, "records": how many they read,
    "quarantined": what txids through the mark set aside}``, or ``{"refused": why}``."""
    with store.db.transaction() as cur:
        _num, spec, committed, _o = store.load(cur, topology_id)
        mark = v.mark(cur, store.schema, topology_id).verified_through
        later = cq.committed_txns(cur, store.schema, topology_id, mark + 1, committed)
        why = _base_refusal(store, cur, spec, mark, later)
        if why:
            return {"refused": why}
        originals = [t for t in later if not t.corrects]
        quarantined = v.quarantined_through(cur, store.schema, topology_id, mark)
    return {"txid": mark, "batch": merged_batch([t.batch for t in originals]) if originals else PlannedBatch(),
            "records": sum(t.planned_records for t in originals), "quarantined": quarantined}


def _base_refusal(store: StateStore, cur: psycopg2.extensions.cursor, spec: TopologySpec, mark: int,
                  later: list[Transaction]) -> str | None:
    topology_id = spec.topology_id
    gone = [t.txid for t in itertools.takewhile(
        lambda t: spec.source.unavailable(cur, store.schema, topology_id, t.batch) is not None,
        (t for t in later if not t.corrects))]
    if gone:
        return (f"txids {gone[0]}..{gone[-1]} were not verified before their input was removed (verified through "
                f"txid {mark}): nothing to start a recomputation from")
    inexact = [s.name for s in spec.recomputable_states if Combiner.parse(s.combiner) not in (Combiner.SUM,
                                                                                            Combiner.COUNT)]
    if inexact:
        return f"states {', '.join(inexact)} keep a min, max or latest value: the verified part cannot be added in"
    history = h.mark(cur, store.schema, topology_id)
    if not history.history_base or history.history_from_txid > mark:
        return f"the delta history does not reach back to txid {mark}, the verified mark"
    reaching = [t.txid for t in later if int((t.corrects or {}).get("txids", [mark + 1])[0]) <= mark]
    if reaching:
        return f"correction txid {reaching[0]} reaches back before txid {mark}, the verified mark"
    return None


def add_audit_base(store: StateStore, topology_id: str, num: int, txid: int) -> None:
    """Add each state as of ``txid`` (its delta history) into the audit's recomputation of the txids
    after it (``core/status.audit_tables``)."""
    with store.db.transaction() as cur:
        spec = store.load(cur, topology_id).spec
        history = h.mark(cur, store.schema, topology_id)
        for state in spec.recomputable_states:
            v.add_base(cur, store.schema, topology_id, state, store.staging(num, state),
                   q.audit_table(store.schema, num, state), history.history_from_txid, txid)
