"""Rebuild a topology's states from its source while it keeps committing, then swap atomically.

OLEP's promise: a derived view can always be recomputed from the log (after a bug fix in the
job, or a damaged table). The steps:

1. :func:`begin` records ``rebuild_from_txid = T0`` (the committed txid). From then on every commit
   keeps its staged rows -- a journal of the deltas applied after T0.
2. The topology's own Spark job recomputes every state over the batches committed through T0
   and loads the result into load tables (``spark_job.rebuild``), as long as it takes.
3. :func:`swap`, ONE database transaction: lock the topology (commits wait), build each state as
   the recomputed values of T0 plus the journaled deltas of T0+1..now under the same value rules,
   replace the state table's contents, drop the journal, clear the mark. Readers see the old
   state or the new one, never a half-built view.

:func:`abort` undoes step 1 (a failed rebuild); ``recover`` then frees the journal.
"""

from __future__ import annotations

from typing import Any

from psycopg2 import sql

from .coordinator import Coordinator
from .exceptions import ConfigError, TransactionalError
from .spec import StateSpec
from .store import sql as q


class RebuildInProgress(TransactionalError):
    """Another rebuild of the topology has begun and not finished."""


def load_table(coordinator: Coordinator, num: int, state: StateSpec) -> sql.Composed:
    return q.audit_table(coordinator.schema, num, state, purpose="rebuild")


def begin(coordinator: Coordinator, topology_id: str) -> int:
    """Mark the rebuild's starting point; returns T0, the txid the recomputation covers."""
    with coordinator.db.transaction() as cur:
        num, spec, committed, _o = coordinator._load(cur, topology_id, lock=True)
        if any(s.database is not None for s in spec.states):
            raise ConfigError(f"topology {topology_id!r} keeps states in another database: rebuild them there "
                              "by replaying the log into a fresh table")
        cur.execute(sql.SQL("SELECT rebuild_from_txid FROM {} WHERE topology_id = %s")
                    .format(coordinator._t("topologies")), (topology_id,))
        running = cur.fetchone()[0]
        if running is not None:
            raise RebuildInProgress(f"topology {topology_id!r} has a rebuild in progress since txid {running}: "
                                    "wait for it, or run 'airflow-txn rebuild --abort' if it died")
        cur.execute(sql.SQL("UPDATE {} SET rebuild_from_txid = %s WHERE topology_id = %s")
                    .format(coordinator._t("topologies")), (committed, topology_id))
        for state in spec.states:
            for stmt in q.create_audit_table(load_table(coordinator, num, state), state):
                cur.execute(stmt)
    return committed


def swap(coordinator: Coordinator, topology_id: str, through_txid: int) -> dict[str, Any]:
    """Replay the journal onto the recomputed states and swap them in (see the module docstring)."""
    with coordinator.db.transaction() as cur:
        num, spec, committed, _o = coordinator._load(cur, topology_id, lock=True)
        cur.execute(sql.SQL("SELECT rebuild_from_txid FROM {} WHERE topology_id = %s")
                    .format(coordinator._t("topologies")), (topology_id,))
        if cur.fetchone()[0] != through_txid:
            raise TransactionalError(f"topology {topology_id!r}: the rebuild from txid {through_txid} was aborted "
                                     "or replaced; nothing was swapped")
        cur.execute(sql.SQL("SELECT txid, attempt FROM {} WHERE topology_id = %s AND txid > %s ORDER BY txid")
                    .format(coordinator._t("commits")), (topology_id, through_txid))
        journal = [(int(t), int(a)) for t, a in cur.fetchall()]
        result: dict[str, Any] = {"topology": topology_id, "rebuilt_at_txid": through_txid,
                                  "caught_up_to_txid": committed, "journal_txids": len(journal), "states": {}}
        for state in spec.states:
            shadow = sql.Identifier(f"txn_rebuild_{state.name}")
            for stmt in q.rebuild_shadow(state, shadow, load_table(coordinator, num, state)):
                cur.execute(stmt, {"txid": through_txid})
            staging = coordinator._staging(num, state)
            for txid, attempt in journal:
                if attempt:  # 0: an empty batch, nothing staged
                    cur.execute(q.upsert(state, shadow, q.staged_delta(staging, state)),
                                {"txid": txid, "attempt": attempt})
            for stmt in q.replace_contents(state, shadow):
                cur.execute(stmt)
            result["states"][state.name] = cur.rowcount
            cur.execute(sql.SQL("DROP TABLE {}").format(load_table(coordinator, num, state)))
            cur.execute(sql.SQL("DELETE FROM {} s USING {} t WHERE t.topology_id = %s AND t.txid = s.txid "
                                "AND t.status = 'committed'").format(staging, coordinator._t("transactions")),
                        (topology_id,))
        cur.execute(sql.SQL("UPDATE {} SET rebuild_from_txid = NULL WHERE topology_id = %s")
                    .format(coordinator._t("topologies")), (topology_id,))
    return result


def abort(coordinator: Coordinator, topology_id: str) -> None:
    """Forget a rebuild that did not finish; the journal is freed by the next ``recover``."""
    with coordinator.db.transaction() as cur:
        num, spec, _c, _o = coordinator._load(cur, topology_id, lock=True)
        cur.execute(sql.SQL("UPDATE {} SET rebuild_from_txid = NULL WHERE topology_id = %s")
                    .format(coordinator._t("topologies")), (topology_id,))
        for state in spec.states:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(load_table(coordinator, num, state)))
    coordinator.recover(topology_id)
