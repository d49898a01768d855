"""What a commit does besides applying deltas to its state tables, in the same transaction:
decide the requests of its decisions, then append its output events (those emitted for a
request only if the request got that verdict). See ``store/decisions.py`` and ``store/outputs.py``."""

from __future__ import annotations

import psycopg2.extensions

from ..exceptions import IdCollision, StagedOutputIncomplete
from ..spec import TopologySpec
from ..store import decisions, outputs
from .context import StateStore


def decide(store: StateStore, cur: psycopg2.extensions.cursor, num: int, spec: TopologySpec,
           txid: int, attempt: int | None) -> dict[str, tuple[int, int]]:
    """Decide the chosen attempt's requests; (granted, declined) by decision."""
    if attempt is None:
        return {}
    return {d.name: decisions.decide(cur, store.schema, spec.topology_id, d, spec.state(d.state),
                                     store.decision_staging(num, d), store.decision_runs(num, d), txid, attempt,
                                     declines=bool(spec.outputs))
            for d in spec.decisions}


def append_outputs(store: StateStore, cur: psycopg2.extensions.cursor, num: int, spec: TopologySpec,
                   txid: int, attempt: int | None) -> dict[str, int]:
    """Append the chosen attempt's output events to their logs; events appended, by output."""
    if not spec.outputs or attempt is None:
        return {}
    targets = [outputs.Target(o.name, o.log_name) for o in spec.outputs]
    outputs.resolve(cur, store.schema, store.out_staging(num), targets, spec.topology_id, txid, attempt)
    try:
        return outputs.append(cur, store.schema, store.out_staging(num), targets, txid, attempt,
                              only=decisions.output_filter(store.schema, spec.topology_id) if spec.decisions else None,
                              topology_id=spec.topology_id)
    except IdCollision as exc:
        raise StagedOutputIncomplete(
            f"topology {spec.topology_id!r} txid {txid} attempt {attempt}: output event {exc}. Its id is the "
            f"topology's ('{spec.topology_id}:<origin>'), so it was not appended by a producer (the log refuses "
            "them those ids); it was written straight into the log, or the topology was reset and its transform "
            f"now emits another payload under that origin. Nothing is committed: remove the stray event from log "
            f"{exc.log!r} as the schema's owner, or have the transform give its new events new origins") from None
    except LookupError as exc:
        raise StagedOutputIncomplete(
            f"topology {spec.topology_id!r} txid {txid} attempt {attempt}: an output event is staged for a "
            f"partition its log lacks ({exc}): process the txid again (a new attempt), then commit") from None
