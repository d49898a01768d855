"""Status, recovery and audit: what a topology has committed and has in flight, discarding staged
output that can never commit (KIP-844's recover), and the pieces of a recomputation's diff."""

from __future__ import annotations

import logging
from typing import Any

import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from ..spec import StateSpec
from ..store import sql as q
from . import liveness
from .context import StateStore
from .model import (
    InFlight,
    RecoverResult,
    TopologyStatus,
)

log = logging.getLogger("airflow_transactional.coordinator")


def status(store: StateStore, topology_id: str) -> TopologyStatus:
    with store.db.transaction() as cur:
        _num, spec, committed, offsets = store.load(cur, topology_id)
        cur.execute(sql.SQL("SELECT last_commit_at, lost_records FROM {} WHERE topology_id = %s")
                    .format(store.t("topologies")), (topology_id,))
        last_commit_at, lost = cur.fetchone()
        cur.execute(sql.SQL(
            "SELECT t.txid, t.run_key, t.plan_version, t.batch, "
            "(SELECT count(*) FROM {a} x WHERE x.topology_id = t.topology_id AND x.txid = t.txid), "
            "(SELECT array[x.status, x.error] FROM {a} x WHERE x.topology_id = t.topology_id AND "
            "x.txid = t.txid AND x.plan_version = t.plan_version ORDER BY x.attempt DESC LIMIT 1) "
            "FROM {t} t WHERE t.topology_id = %s AND t.status = 'planned' ORDER BY t.txid")
            .format(a=store.t("attempts"), t=store.t("transactions")), (topology_id,))
        in_flight = []
        for txid, run_key, version, _batch, n_attempts, latest in cur.fetchall():
            st, err = latest if latest else (None, None)
            phase = {"running": "processing", "complete": "processed", "failed": "failed"}.get(
                st or "", "planned")
            in_flight.append(InFlight(int(txid), run_key, phase, int(version), int(n_attempts),
                                      err if phase == "failed" else None))
        cur.execute(sql.SQL("SELECT count(*) FILTER (WHERE committed), count(*) FILTER (WHERE NOT committed) "
                            "FROM {} WHERE topology_id = %s").format(store.t("quarantine")), (topology_id,))
        q_done, q_pending = cur.fetchone()
        lag = spec.source.lag(cur, store.schema, topology_id, offsets)
    blocked = liveness.blocker(store, topology_id, committed + 2)
    nxt = next((f for f in in_flight if f.txid == committed + 1), None)
    if blocked is None and nxt is not None and nxt.phase == "failed":
        blocked = (f"blocked by failed txid {nxt.txid} (run {nxt.run_key}): {nxt.error}; clear or "
                   "backfill that run to process it again (Airflow retries it first if retries are left)")
    return TopologyStatus(topology_id, committed, offsets, last_commit_at, in_flight, int(lag),
                          blocked, int(q_done), int(q_pending), int(lost))


def recover(store: StateStore, topology_id: str) -> RecoverResult:
    """Discard staged output that can never be committed; safe to run at any time.

    Kept: rows of running attempts and of the latest complete attempt of each uncommitted
    txid's current plan (and a pinned attempt). Everything else -- failed, discarded,
    superseded, outdated-plan, committed-txid and orphaned rows -- is deleted.
    """
    result = RecoverResult()
    with store.db.transaction() as cur:
        num, spec, _committed, _o = store.load(cur, topology_id, lock=True)
        a, t = store.t("attempts"), store.t("transactions")
        cur.execute(sql.SQL(
            "UPDATE {a} x SET status = 'discarded', finished_at = coalesce(x.finished_at, clock_timestamp()), "
            "error = coalesce(x.error, 'superseded or outdated') FROM {t} WHERE x.topology_id = %s "
            "AND {t}.topology_id = x.topology_id AND {t}.txid = x.txid AND x.status = 'complete' AND "
            "x.attempt IS DISTINCT FROM {t}.pinned_attempt AND ({t}.status = 'committed' OR "
            "x.plan_version <> {t}.plan_version OR x.attempt < (SELECT max(y.attempt) FROM {a} y "
            "WHERE y.topology_id = x.topology_id AND y.txid = x.txid AND y.status = 'complete' "
            "AND y.plan_version = {t}.plan_version))").format(a=a, t=t), (topology_id,))
        result.attempts_discarded = cur.rowcount
        # Kept too: the committed attempts after a running rebuild's txid (its journal).
        keep = sql.SQL(
            "EXISTS (SELECT 1 FROM {a} x JOIN {t} USING (topology_id, txid) WHERE x.topology_id = %s "
            "AND x.txid = s.txid AND x.attempt = s.attempt AND (({t}.status = 'planned' AND "
            "(x.attempt = {t}.pinned_attempt OR (x.plan_version = {t}.plan_version AND "
            "x.status IN ('running', 'complete')))) OR (x.status = 'committed' AND x.txid > "
            "(SELECT coalesce(rebuild_from_txid, 9223372036854775807) FROM {topo} WHERE topology_id = %s))))"
        ).format(a=a, t=t, topo=store.t("topologies"))
        for state in spec.states:
            cur.execute(sql.SQL("DELETE FROM {} s WHERE NOT {}").format(store.staging(num, state), keep),
                        (topology_id, topology_id))
            if cur.rowcount:
                result.details.append(f"{state.name}: {cur.rowcount} staged rows")
            result.staged_rows_deleted += cur.rowcount
        cur.execute(sql.SQL("DELETE FROM {q} s WHERE s.topology_id = %s AND NOT s.committed AND NOT "
                            "EXISTS (SELECT 1 FROM {a} x WHERE x.topology_id = s.topology_id AND "
                            "x.txid = s.txid AND x.attempt = s.attempt AND x.status IN ('running', 'complete'))")
                    .format(q=store.t("quarantine"), a=a), (topology_id,))
        result.quarantine_rows_deleted = cur.rowcount
    if result.staged_rows_deleted or result.attempts_discarded:
        log.info("topology %s: recover discarded %d attempts and %d staged rows", topology_id,
                 result.attempts_discarded, result.staged_rows_deleted)
    return result


def commits(store: StateStore, topology_id: str) -> list[dict[str, Any]]:
    """The audit log of a topology, in txid order."""
    with store.db.transaction() as cur:
        store.load(cur, topology_id)  # UnknownTopology, not an empty log, for a wrong name
        cur.execute(sql.SQL("SELECT txid, attempt, plan_version, run_key, start_offsets, end_offsets, "
                            "records_read, row_counts, quarantined, committer, commit_started_at, "
                            "committed_at FROM {} WHERE topology_id = %s ORDER BY txid")
                    .format(store.t("commits")), (topology_id,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def topology_num(store: StateStore, cur: psycopg2.extensions.cursor, topology_id: str) -> int:
    return store.load(cur, topology_id)[0]


def committed_batch(store: StateStore, topology_id: str, through_txid: int | None = None
                    ) -> tuple[dict[str, Any], str | None]:
    """A batch covering everything committed (through ``through_txid``), or why it cannot be
    recomputed from the source."""
    with store.db.transaction() as cur:
        _num, spec, committed, offsets = store.load(cur, topology_id)
        if through_txid is not None and through_txid != committed:
            cur.execute(sql.SQL("SELECT end_offsets FROM {} WHERE topology_id = %s AND txid = %s")
                        .format(store.t("commits")), (topology_id, through_txid))
            row = cur.fetchone()
            offsets = dict(row[0]) if row else {}
        cur.execute(sql.SQL("SELECT batch->'lost'->'ranges' FROM {} WHERE topology_id = %s AND txid <= %s "
                            "AND status = 'committed' AND batch ? 'lost'").format(store.t("transactions")),
                    (topology_id, committed if through_txid is None else through_txid))
        lost = [r for (ranges,) in cur.fetchall() for r in (ranges or [])]
        return spec.source.committed_batch(cur, store.schema, topology_id, offsets, lost)


def audit_tables(store: StateStore, topology_id: str) -> tuple[int, dict[str, str]]:
    """Create a fresh table per state for an audit's recomputation; (topology number, the COPY
    statement that loads each, by state) -- the number is what :func:`diff_audit` takes."""
    with store.db.transaction() as cur:
        num, spec, _c, _o = store.load(cur, topology_id)
    copies = {}
    for state in spec.states:
        table = create_audit_table(store, num, state)
        with store.db.transaction() as cur:
            copies[state.name] = q.copy_into(table, [*state.key_columns, "value"]).as_string(cur)
    return num, copies


def create_audit_table(store: StateStore, num: int, state: StateSpec) -> sql.Composed:
    table = q.audit_table(store.schema, num, state)
    with store.db.transaction() as cur:
        for stmt in q.create_audit_table(table, state):
            cur.execute(stmt)
    return table


def diff_audit(store: StateStore, topology_id: str, num: int, committed_txid: int, samples: int = 10
               ) -> dict[str, Any] | None:
    """Diff the recomputed states against the state tables, holding commits off meanwhile.

    Returns None when a commit landed since ``committed_txid`` (recompute and try again).
    """
    with store.db.transaction() as cur:
        cur.execute(sql.SQL("SELECT committed_txid FROM {} WHERE topology_id = %s FOR SHARE")
                    .format(store.t("topologies")), (topology_id,))
        if int(cur.fetchone()[0]) != committed_txid:
            return None
        spec = store.load(cur, topology_id)[1]
        result: dict[str, Any] = {"topology": topology_id, "auditable": True,
                                  "committed_txid": committed_txid, "differences": 0,
                                  "states": {}, "samples": []}
        for state in spec.states:
            table = q.audit_table(store.schema, num, state)
            cur.execute(q.audit_diff(state, table))
            rows = cur.fetchall()
            cur.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
            result["states"][state.name] = {"keys": int(cur.fetchone()[0]), "differences": len(rows)}
            result["differences"] += len(rows)
            result["samples"] += [f"{state.name}[{k}]: stored {s}, recomputed {r}" for k, s, r in rows[:samples]]
            cur.execute(sql.SQL("DROP TABLE {}").format(table))
    return result
