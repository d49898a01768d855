"""A state build's fold of the history in chunks of txids (``core/evolution.py``'s step 3).

The committed txids 1..M are split once, when the fold first begins, into about :data:`CHUNKS`
chunks of about equal records (``store/builds.py``); the committed replays' records are one more
chunk (txids 0..0), folded last. Each chunk is read again as its txids' batches merged (what they
read, as a correction reads it), folded by the topology's own code into fresh part tables, and
folded into the build's load tables by the state's combiner in the transaction that marks it done.
So a build whose process died is taken up from the first chunk not done, never counting one twice;
and its progress -- the txid the fold has reached of M, and an ETA from the rate of the chunks done
-- is what ``status``, ``airflow-txn evolve``, the Transactions view and the commit task's metrics
show.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from psycopg2 import sql

from ..exceptions import TransactionalError
from ..model import BuildProgress, PlannedBatch
from ..spec import StateSpec
from ..store import builds, catalog
from ..store import state as q
from ..store.builds import Chunk
from . import reread
from .context import StateStore

if TYPE_CHECKING:
    from .evolution import Build

__all__ = ["CHUNKS", "begin_chunk", "end_chunk", "load_table", "part_table", "pending", "progress"]

#: About how many chunks the history is folded in: the progress moves in about tenths.
CHUNKS = 10


def load_table(store: StateStore, num: int, state: StateSpec) -> sql.Composed:
    """Where a build loads a state as of M: its chunks folded in, then the switch's catch-up."""
    return q.audit_table(store.schema, num, state, purpose="build")


def part_table(store: StateStore, num: int, state: StateSpec) -> sql.Composed:
    """Where a chunk's fold of a state is staged before it joins the load table."""
    return q.audit_table(store.schema, num, state, "build_part")


def pending(store: StateStore, build: Build) -> list[Chunk]:
    """The chunks of the build not folded yet, in the order they are folded (the history's in txid
    order, the replays' last) -- planned at the fold's first start, kept when it is taken up."""
    with store.db.transaction() as cur:
        num, _spec, _c, _o = store.load(cur, build.topology_id)
        chunks = builds.table(store.schema, num)
        builds.create(cur, chunks)
        planned = builds.read(cur, chunks)
        if not planned:
            planned = [*_split(builds.planned_records(cur, store.schema, build.topology_id, build.through_txid)),
                       Chunk(0, 0, 0)]
            builds.add(cur, chunks, planned)
    return sorted((c for c in planned if c.done_at is None), key=lambda c: (c.last_txid == 0, c.last_txid))


def _split(txids: list[tuple[int, int]]) -> list[Chunk]:
    """Consecutive runs of ``(txid, records)`` of about equal records, about :data:`CHUNKS` of them."""
    target = max(1, -(-sum(n for _t, n in txids) // CHUNKS))
    chunks: list[Chunk] = []
    first, records = None, 0
    for txid, n in txids:
        first, records = txid if first is None else first, records + n
        if records >= target:
            chunks.append(Chunk(first, txid, records))
            first, records = None, 0
    if first is not None:
        chunks.append(Chunk(first, txids[-1][0], records))
    return chunks


def begin_chunk(store: StateStore, build: Build, chunk: Chunk) -> tuple[dict[str, str], PlannedBatch | None]:
    """Start folding ``chunk``: fresh part tables (the COPY that loads each, by state) and the batch to
    fold into them (None: no record of the source -- the replays' chunk, or txids that read none)."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, build.topology_id)
        builds.started(cur, builds.table(store.schema, num), chunk.last_txid)
        copies = {}
        for name in build.states:
            state = spec.state(name)
            catalog.drop(cur, part_table(store, num, state), if_exists=True)
            for stmt in q.create_audit_table(part_table(store, num, state), state):
                cur.execute(stmt)
            copies[name] = q.copy_into(part_table(store, num, state), [*state.key_columns, "value"],
                                       csv=True).as_string(cur)
        again = None if chunk.last_txid == 0 or chunk.records == 0 else reread.committed_range(
            cur, store.schema, build.topology_id, chunk.first_txid, chunk.last_txid)
        missing = None if again is None else spec.source.unavailable(cur, store.schema, build.topology_id, again[0])
    if missing:
        raise TransactionalError(f"topology {build.topology_id!r}: states {list(build.states)} cannot be built from "
                                 f"its source: txids {chunk.first_txid}..{chunk.last_txid} cannot be read again "
                                 f"({missing}); the source's retention removed what they read")
    return copies, None if again is None else again[0]


def end_chunk(store: StateStore, build: Build, chunk: Chunk) -> None:
    """Fold the chunk's part tables into the load tables and mark it done, in one transaction."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, build.topology_id)
        for name in build.states:
            state = spec.state(name)
            cur.execute(q.fold_recomputed(state, load_table(store, num, state), part_table(store, num, state)))
            catalog.drop(cur, part_table(store, num, state))
        builds.done(cur, builds.table(store.schema, num), chunk.last_txid)


def progress(cur: Any, schema: str, num: int, through_txid: int, now: datetime) -> BuildProgress | None:
    """The progress of the build of topology number ``num`` (None: its fold has not begun)."""
    chunks = builds.table(schema, num)
    if not catalog.exists(cur, chunks):
        return None
    planned = [c for c in builds.read(cur, chunks) if c.last_txid > 0]
    if not planned:
        return None
    done = [c for c in planned if c.done_at is not None]
    timed = [c for c in done if c.started_at is not None and c.done_at is not None]
    seconds = sum((c.done_at - c.started_at).total_seconds() for c in timed if c.done_at and c.started_at)
    # The seconds left: the records not folded at the rate of the chunks done, less the running chunk's time.
    left = sum(c.records for c in planned if c.done_at is None)
    eta = None
    if timed and seconds > 0:
        running = [c for c in planned if c.done_at is None and c.started_at is not None]
        spent = (now - running[0].started_at).total_seconds() if running and running[0].started_at else 0.0
        eta = max(0.0, left * seconds / max(1, sum(c.records for c in timed)) - spent)
    return BuildProgress(max((c.last_txid for c in done), default=0), through_txid,
                         sum(c.records for c in done), sum(c.records for c in planned), eta)
