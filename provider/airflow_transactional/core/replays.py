"""Replays: quarantined records fixed and counted, as a transaction of their own.

A record set aside as bad keeps its text and where it came from (source offset, event id, the txid
that quarantined it, the reason). Once the transform is fixed -- or the record is, by hand
(:func:`edit`) -- an operator replays a chosen set (:func:`plan_replay`: by id, or by the txids that
quarantined them and a reason): the next txid, whose batch is those records, read from the
quarantine (each as edited if it was), processed by the topology's own job and committed in order
like any txid. Each record is taken by the replay when it is planned, so it is replayed at most
once; at the commit the records the replay counted are marked with it, and one that fails again is
quarantined anew by the replay, with its new reason (:func:`settle`), ready for another fix.

A replay adds records that were never counted, so it works on every state; it refuses what a
correction refuses of the topology itself (``core/corrections.py``), records whose text the
quarantine only kept a prefix of (edit them first), and sources whose records are not text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg2.extensions

from .. import limits
from ..exceptions import ConfigError
from ..model import ReplayBatch, Transaction
from ..ranges import MAX_ID, txid_range
from ..sources.base import Record
from ..spec import TopologySpec
from ..store import corrections as cq
from ..store import transactions
from .context import StateStore
from .corrections import next_slot, refusal

#: What a replay run's conf may name: ``{"replay": {"ids": [...]}}`` or ``{"replay": {"txids": "3..7",
#: "reason": "..."}}``.
SELECTORS = ("ids", "txids", "reason")


def _replayable(spec: TopologySpec) -> None:
    why = refusal(spec, replay=True)
    if why is None and not spec.source.records_are_text():
        why = "its records are not text (Parquet or CSV files): fix the files and land them again instead"
    if why:
        raise ConfigError(f"topology {spec.topology_id!r} cannot replay quarantined records: {why}")


def plan_replay(store: StateStore, topology_id: str, run_key: str, selection: dict[str, Any]) -> Transaction:
    """The replay that run ``run_key`` is: planned now (the next txid, taking the records ``selection``
    names) if new, else the stored one."""
    unknown = set(selection) - set(SELECTORS)
    ids = selection.get("ids")
    if unknown or not selection or (ids is not None and (not isinstance(ids, list) or not ids
                                                         or any(type(i) is not int or not 1 <= i <= MAX_ID
                                                                for i in ids))):
        raise ConfigError(f"a replay names quarantined records as {{'ids': [ids]}} or {{'txids': 'A..B', 'reason': "
                          f"'...'}} (either key alone too), got {selection!r}")
    with store.db.transaction() as cur:
        _num, spec, committed, offsets = store.load(cur, topology_id, lock=True)
        known = transactions.txid_of_run(cur, store.schema, topology_id, run_key)
        if known is not None:
            txn = store.txn(cur, topology_id, known)
            if not txn.corrects or "replay" not in txn.corrects:
                raise ConfigError(f"run {run_key!r} is txid {known} of topology {topology_id!r}, not a replay")
            return txn
        _replayable(spec)
        txid, at = next_slot(store, cur, spec, committed, offsets)
        taken = _take(store, cur, topology_id, txid, selection)
        ids = sorted(t.id for t in taken)
        corrects = {"replay": ids, "of_txids": sorted({t.txid for t in taken})}
        transactions.insert(cur, store.schema, topology_id, txid, run_key, at, at, ReplayBatch(replay=tuple(ids)),
                            len(ids), corrects=corrects)
        return store.txn(cur, topology_id, txid)


def _take(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str, txid: int,
          selection: dict[str, Any]) -> list[cq.Taken]:
    """Take the selected records for replay ``txid``, or refuse (rolling back) naming why."""
    ids = selection.get("ids")
    span = txid_range(selection["txids"]) if selection.get("txids") is not None else None
    if ids is not None:
        refused = cq.why_not_replayable(cur, store.schema, topology_id, ids)
        if refused:
            raise ConfigError(f"topology {topology_id!r}: records cannot be replayed: "
                              + "; ".join(f"{i}: {why}" for i, why in refused[:10]))
    taken = cq.take_for_replay(cur, store.schema, topology_id, txid, ids=ids, txids=span,
                               reason=selection.get("reason"))
    if not taken:
        raise ConfigError(f"topology {topology_id!r}: no quarantined record to replay matches {selection!r} (each is "
                          f"replayed once: see 'airflow-txn quarantine {topology_id}')")
    cut = [t.id for t in taken if not t.whole]
    if cut:
        raise ConfigError(f"topology {topology_id!r}: the quarantine kept only a prefix of records {cut[:10]} (they "
                          "are longer than it keeps): edit them ('airflow-txn quarantine --edit ID') with their whole "
                          "text, or land them again")
    return taken


def read(store: StateStore, txn: Transaction) -> Iterator[Record]:
    """The records of a replay's batch, each as edited if it was, at its source offset."""
    assert isinstance(txn.batch, ReplayBatch), txn.batch
    yield from records(store, txn.topology_id, txn.batch)


def records(store: StateStore, topology_id: str, batch: ReplayBatch) -> list[Record]:
    """The records of replay batch ``batch`` (a few: the quarantine's), each as edited if it was."""
    with store.db.transaction() as cur:
        rows = cq.replay_records(cur, store.schema, topology_id, list(batch.replay))
    return [Record(offset, event_id, payload) for offset, event_id, payload in rows]


def settle(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str, txn: Transaction,
           attempt: int) -> int:
    """In the replay's commit: mark what it counted; how many bad records it keeps."""
    return cq.settle_replay(cur, store.schema, topology_id, txn.txid, attempt)


def edit(store: StateStore, topology_id: str, record_id: int, text: str) -> None:
    """Keep ``text`` as what a replay of quarantined record ``record_id`` reads in its place."""
    why = limits.edit_refusal(text)
    if why is not None:
        raise ConfigError(f"record {record_id} of {topology_id!r} was not edited: {why}; fix it and edit again")
    with store.db.transaction() as cur:
        store.load(cur, topology_id)
        if not cq.edit(cur, store.schema, topology_id, record_id, text):
            raise ConfigError(f"topology {topology_id!r} has no quarantined record {record_id} left to replay (it is "
                              "not there, or a replay or a correction already took it)")


def quarantined(store: StateStore, topology_id: str, *, txid: int | None = None, reason: str | None = None,
                limit: int = 1000) -> list[dict[str, Any]]:
    """The committed quarantined records (of one txid, one reason) and what became of them."""
    with store.db.transaction() as cur:
        store.load(cur, topology_id)
        return [r._asdict() for r in cq.listed(cur, store.schema, topology_id, txid=txid, reason=reason, limit=limit)]
