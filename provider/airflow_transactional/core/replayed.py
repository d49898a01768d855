"""What operators fixed and replayed, inside a recomputation from the source.

A replay commits quarantined records, each as edited if it was (``core/replays.py``): records the
source still holds as they were -- bad. A recomputation that read the source alone (an audit, a
rebuild) would set them aside again and lose every fix; the one definition of what was committed
is the source's batches *and* the committed replays' records. So an audit or a rebuild also
recomputes the records the committed replays took (each once, with its latest text), into tables
of their own, and folds them into its recomputation under each state's value rule: the result is
what the commits counted, the operators' fixes included.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import ReplayBatch
from ..spec import StateSpec, TopologySpec
from ..store import catalog
from ..store import corrections as cq
from ..store import state as q
from .context import StateStore

__all__ = ["committed", "copies", "fold_in"]


def committed(store: StateStore, topology_id: str, first: int, last: int) -> ReplayBatch | None:
    """The quarantined records the replays committed as txids ``first``..``last`` took, as one
    batch (None: no replay committed there)."""
    with store.db.transaction() as cur:
        store.load(cur, topology_id)
        ids = cq.committed_replay_ids(cur, store.schema, topology_id, first, last)
    return ReplayBatch(replay=tuple(ids)) if ids else None


def _states(spec: TopologySpec, names: Sequence[str] | None) -> tuple[StateSpec, ...]:
    return spec.recomputable_states if names is None else tuple(spec.state(n) for n in names)


def copies(store: StateStore, topology_id: str, purpose: str, states: Sequence[str] | None = None) -> dict[str, str]:
    """Fresh tables for the replays' part of a recomputation (``purpose``: ``audit``, ``rebuild``
    or ``build``, whose tables it is folded into), and the COPY statement that loads each, by state
    (``states``: those of a state build; else every recomputable one)."""
    out = {}
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id)
        for state in _states(spec, states):
            table = q.audit_table(store.schema, num, state, f"{purpose}_replays")
            for stmt in q.create_audit_table(table, state):
                cur.execute(stmt)
            out[state.name] = q.copy_into(table, [*state.key_columns, "value"], csv=True).as_string(cur)
    return out


def fold_in(store: StateStore, topology_id: str, purpose: str, states: Sequence[str] | None = None) -> None:
    """Fold the replays' part into the recomputation of ``purpose`` (each key's values combined by
    its state's rule), and drop it."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id)
        for state in _states(spec, states):
            extra = q.audit_table(store.schema, num, state, f"{purpose}_replays")
            cur.execute(q.fold_recomputed(state, q.audit_table(store.schema, num, state, purpose), extra))
            catalog.drop(cur, extra)
