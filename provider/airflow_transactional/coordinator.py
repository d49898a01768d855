"""The coordinator: plans transactions, records processing attempts, commits in txid order.

This file is the commit protocol. The life of a transaction (Storm's design 3):

1. ``plan(topology, run_key)`` gives the run the next txid and fixes its batch as exact source
   offsets starting where the previous txid's batch ended -- once: the same run key always gets
   the same txid and the same stored batch.
2. ``begin_attempt`` / ``stage`` / ``finish_attempt``: a processing attempt (any number may run,
   for many txids at once) writes partial results to staging tables keyed by (txid, attempt),
   never to the state tables.
3. ``commit(topology, txid)``: ONE database transaction that locks the topology row, checks
   ``txid == committed_txid + 1``, verifies the staged output of the latest complete attempt,
   applies it to every state table under the value rules, advances the checkpoint (committed
   txid and source offsets), writes the audit row and drops the staged rows.
4. ``recover``: discards staged output that can never be committed (KIP-844's recover).

States in another database (``StateSpec(database=...)``) cannot share that transaction. Their
commit first *pins* the attempt (so no re-plan or newer attempt can change what is applied),
then applies it there under the per-value txid rule (idempotent), then runs the main commit.
"""

from __future__ import annotations

import io
import logging
import os
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql
from psycopg2.extras import Json

from . import faults, identifiers
from .exceptions import (
    BatchUnavailable,
    ConfigError,
    DeclarationChanged,
    NotProcessed,
    ReplayBehindState,
    SchemaMismatch,
    StagedOutputIncomplete,
    StaleAttempt,
    TooManyInFlight,
    UnknownTopology,
    UnknownTransaction,
    WaitingForPredecessor,
)
from .sources.base import BatchPlan, Offsets, Record
from .spec import StateSpec, TopologySpec, incompatible_changes
from .store import sql as q
from .store.connection import Database
from .store.migrations import DEFAULT_SCHEMA, migrate

log = logging.getLogger(__name__)

#: How much of a bad record's raw text the quarantine keeps (its full length is kept beside it).
QUARANTINE_RECORD_CHARS = 4096
QUARANTINE_COLUMNS = ("topology_id", "txid", "attempt", "source_offset", "event_id", "reason", "record",
                      "record_length")


@dataclass(frozen=True)
class Transaction:
    """One planned transaction (one DAG run)."""

    topology_id: str
    txid: int
    run_key: str
    plan_version: int
    start_offsets: Offsets
    end_offsets: Offsets
    batch: dict[str, Any]
    planned_records: int
    status: str
    planned_at: datetime
    committed_at: datetime | None
    pinned_attempt: int | None

    @property
    def empty(self) -> bool:
        return self.planned_records == 0

    @property
    def committed(self) -> bool:
        return self.status == "committed"


_TXN_COLUMNS = sql.SQL("topology_id, txid, run_key, plan_version, start_offsets, end_offsets, batch, "
                       "planned_records, status, planned_at, committed_at, pinned_attempt")
_FOR_UPDATE = {True: sql.SQL("FOR UPDATE"), False: sql.SQL("")}


@dataclass(frozen=True)
class Attempt:
    """One processing attempt of a transaction."""

    topology_id: str
    txid: int
    attempt: int
    plan_version: int


@dataclass(frozen=True)
class CommitResult:
    topology_id: str
    txid: int
    committed: bool  # False: the txid was committed before; nothing was done
    attempt: int | None
    committed_at: datetime | None
    message: str


@dataclass(frozen=True)
class InFlight:
    txid: int
    run_key: str
    phase: str  # planned | processing | processed | failed
    plan_version: int
    attempts: int
    error: str | None = None


@dataclass(frozen=True)
class TopologyStatus:
    topology_id: str
    committed_txid: int
    committed_offsets: Offsets
    last_commit_at: datetime | None
    in_flight: list[InFlight]
    lag: int
    blocked_by: str | None
    quarantined: int
    quarantined_pending: int
    lost_records: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "topology_id": self.topology_id,
            "committed_txid": self.committed_txid,
            "committed_offsets": self.committed_offsets,
            "last_commit_at": self.last_commit_at.isoformat() if self.last_commit_at else None,
            "in_flight": [vars(f) for f in self.in_flight],
            "lag": self.lag,
            "blocked_by": self.blocked_by,
            "quarantined": self.quarantined,
            "quarantined_pending": self.quarantined_pending,
            "lost_records": self.lost_records,
        }


@dataclass
class RecoverResult:
    staged_rows_deleted: int = 0
    attempts_discarded: int = 0
    quarantine_rows_deleted: int = 0
    details: list[str] = field(default_factory=list)


def same_offsets(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Offsets are equal when every position is; a missing position counts as 0."""
    return all(int(a.get(k, 0)) == int(b.get(k, 0)) for k in set(a) | set(b))


def _stored_batch(bp: BatchPlan) -> dict[str, Any]:
    """The batch as stored in the plan, with what retention removed from it, if anything."""
    batch = dict(bp.batch)
    if bp.lost_records:
        batch["lost"] = {"records": bp.lost_records, "detail": bp.lost_detail, "ranges": bp.lost_ranges}
    return batch


def _copy_field(value: Any) -> str:
    if value is None:
        return "\\N"
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


class Coordinator:
    """Plans, attempts, commits and status of the topologies kept in one state store.

    ``dsn`` is the store's database; ``external_dsns`` maps the ``database`` names used by
    states kept elsewhere to their DSNs (never stored, never logged).
    """

    def __init__(self, dsn: str, *, schema: str = DEFAULT_SCHEMA,
                 external_dsns: Mapping[str, str] | None = None, worker: str | None = None) -> None:
        self.schema = identifiers.name("schema name", schema)
        self.db = Database(dsn)
        self._external_dsns = dict(external_dsns or {})
        self._external: dict[str, Database] = {}
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self._specs: dict[str, tuple[int, TopologySpec]] = {}

    def close(self) -> None:
        self.db.close()
        for ext in self._external.values():
            ext.close()

    # -- helpers ---------------------------------------------------------------------------

    def _t(self, table: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(table))

    def _ext_db(self, name: str) -> Database:
        if name not in self._external:
            if name not in self._external_dsns:
                raise ConfigError(
                    f"state database {name!r} is not configured: pass "
                    f"Coordinator(external_dsns={{{name!r}: dsn}}) (the DAG API maps it from a connection)")
            self._external[name] = Database(self._external_dsns[name])
        return self._external[name]

    def _staging(self, num: int, state: StateSpec) -> sql.Composed:
        return q.staging_table(self.schema, num, state)

    def _load(self, cur: psycopg2.extensions.cursor, topology_id: str, *, lock: bool = False
              ) -> tuple[int, TopologySpec, int, Offsets]:
        try:
            cur.execute(sql.SQL("SELECT num, spec, committed_txid, committed_offsets FROM {} WHERE topology_id = %s {}")
                        .format(self._t("topologies"), _FOR_UPDATE[lock]), (topology_id,))
        except psycopg2.errors.UndefinedTable:
            raise UnknownTopology(topology_id, f"this database has no provider schema {self.schema!r} (is it the "
                                  "right database and --schema?)") from None
        row = cur.fetchone()
        if row is None:
            raise UnknownTopology(topology_id)
        num, spec_cfg, committed, offsets = row
        cached = self._specs.get(topology_id)
        if cached is None or cached[1].to_config() != spec_cfg:
            cached = (int(num), TopologySpec.from_config(spec_cfg))
            self._specs[topology_id] = cached
        return cached[0], cached[1], int(committed), dict(offsets)

    def _txn(self, cur: psycopg2.extensions.cursor, topology_id: str, txid: int, *,
             lock: bool = False) -> Transaction:
        cur.execute(sql.SQL("SELECT {} FROM {} WHERE topology_id = %s AND txid = %s {}")
                    .format(_TXN_COLUMNS, self._t("transactions"), _FOR_UPDATE[lock]), (topology_id, txid))
        row = cur.fetchone()
        if row is None:
            raise UnknownTransaction(f"topology {topology_id!r} has no txid {txid}: plan it first")
        return Transaction(*row)

    # -- registration ----------------------------------------------------------------------

    def migrate(self) -> list[int]:
        return migrate(self.db, self.schema)

    def register(self, spec: TopologySpec) -> None:
        """Create or update a topology, its state and staging tables (idempotent).

        Once a topology is registered, registering it again unchanged runs no DDL: a run-time
        role with DML rights only (``store.privileges``) can call this on every run.
        """
        try:
            self._register(spec)
        except psycopg2.errors.InsufficientPrivilege as exc:
            raise ConfigError(
                f"topology {spec.topology_id!r} cannot be registered by this role "
                f"({str(exc).splitlines()[0]}): registering creates tables, which only the schema's owner may do. "
                f"Register it as the owner ('airflow-txn --dsn-file OWNER_DSN register DAG_FILE', then "
                f"'airflow-txn grant --runtime-role ROLE'), or give this role ownership of schema {self.schema!r}"
            ) from None

    def _register(self, spec: TopologySpec) -> None:
        self.migrate()
        for state in spec.states:
            if state.database is not None:
                with self._ext_db(state.database).transaction() as ecur:
                    self._ensure_state_table(ecur, state)
        config = spec.to_config()
        with self.db.transaction() as cur:
            cur.execute(sql.SQL("SELECT spec, committed_txid, EXISTS (SELECT 1 FROM {} t WHERE t.topology_id = %s) "
                                "FROM {} WHERE topology_id = %s FOR UPDATE")
                        .format(self._t("transactions"), self._t("topologies")), (spec.topology_id, spec.topology_id))
            row = cur.fetchone()
            if row is not None and (row[1] or row[2]):  # planned at least once: offsets mean something
                changes = incompatible_changes(row[0], config)
                if changes:
                    raise DeclarationChanged(spec.topology_id, changes, int(row[1]))
            cur.execute(sql.SQL(
                "INSERT INTO {} (topology_id, spec) VALUES (%s, %s) ON CONFLICT (topology_id) "
                "DO UPDATE SET spec = EXCLUDED.spec, updated_at = now() RETURNING num")
                .format(self._t("topologies")), (spec.topology_id, Json(config)))
            num = int(cur.fetchone()[0])
            spec.source.register(cur, self.schema, spec.topology_id)
            for state in spec.states:
                if state.database is None:
                    self._ensure_state_table(cur, state)
                if not self._exists(cur, self._staging(num, state)):
                    cur.execute(q.create_staging_table(self._staging(num, state), state))
        self._specs[spec.topology_id] = (num, spec)

    @staticmethod
    def _exists(cur: psycopg2.extensions.cursor, table: sql.Composed) -> bool:
        """Whether ``table`` exists. Checked before each CREATE: ``CREATE ... IF NOT EXISTS`` needs
        the CREATE privilege even when there is nothing to create, and a run-time role has none."""
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table.as_string(cur),))
        return bool(cur.fetchone()[0])

    def reset(self, topology_id: str) -> list[str]:
        """Forget a topology's progress -- plans, attempts, commits, quarantine, staged output --
        and drop its state tables in this store, so its next run starts over from the beginning of
        its source under its current declaration. Returns the tables dropped.

        States kept in another database are not reachable from here: drop those there.
        """
        dropped = []
        with self.db.transaction() as cur:
            num, spec, _c, _o = self._load(cur, topology_id, lock=True)
            for state in spec.states:
                tables = [self._staging(num, state), q.audit_table(self.schema, num, state, purpose="rebuild")]
                if state.database is None:
                    tables.append(q.state_table(state))
                for table in tables:
                    if self._exists(cur, table):
                        cur.execute(sql.SQL("DROP TABLE {}").format(table))
                        dropped.append(table.as_string(cur))
            cur.execute(sql.SQL("DELETE FROM {} WHERE topology_id = %s").format(self._t("quarantine")), (topology_id,))
            cur.execute(sql.SQL("DELETE FROM {} WHERE topology_id = %s").format(self._t("topologies")), (topology_id,))
        self._specs.pop(topology_id, None)
        log.warning("topology %s reset: progress forgotten, dropped %s", topology_id, ", ".join(dropped) or "nothing")
        return dropped

    def _ensure_state_table(self, cur: psycopg2.extensions.cursor, state: StateSpec) -> None:
        schema, table = state.schema_and_table
        if not self._exists(cur, q.state_table(state)):
            create_schema, create_table = q.create_state_table(state)
            cur.execute("SELECT to_regnamespace(%s) IS NULL", (sql.Identifier(schema).as_string(cur),))
            if cur.fetchone()[0]:  # owning the schema is enough: CREATE SCHEMA needs CREATE on the database
                cur.execute(create_schema)
            cur.execute(create_table)
        cur.execute(q.TABLE_COLUMNS, (f'"{schema}"."{table}"',))
        have = dict(cur.fetchall())
        want = q.expected_columns(state)
        if have != want:
            raise SchemaMismatch(
                f"table {schema}.{table} exists with columns {have}, but state {state.name!r} needs "
                f"{want}: point the state at another table (table='...'), or migrate/drop the old one")

    def topologies(self) -> list[TopologySpec]:
        """Every topology registered in this store, by id."""
        with self.db.transaction() as cur:
            cur.execute(sql.SQL("SELECT spec FROM {} ORDER BY topology_id").format(self._t("topologies")))
            return [TopologySpec.from_config(config) for (config,) in cur.fetchall()]

    def spec(self, topology_id: str) -> TopologySpec:
        with self.db.transaction() as cur:
            return self._load(cur, topology_id)[1]

    # -- planning --------------------------------------------------------------------------

    def plan(self, topology_id: str, run_key: str) -> Transaction:
        """The transaction of ``run_key``: planned now if new, else the stored one, unchanged."""
        if not isinstance(run_key, str) or not run_key:
            raise ConfigError(f"run key must be a non-empty string, got {run_key!r}")
        with self.db.transaction() as cur:
            _num, spec, committed, offsets = self._load(cur, topology_id, lock=True)
            cur.execute(sql.SQL("SELECT txid FROM {} WHERE topology_id = %s AND run_key = %s")
                        .format(self._t("transactions")), (topology_id, run_key))
            row = cur.fetchone()
            if row is not None:
                # Planning a run again (a clear, a backfill) means someone is retrying it.
                self._lift_failed(cur, topology_id, int(row[0]))
                return self._txn(cur, topology_id, int(row[0]))
            cur.execute(sql.SQL("SELECT txid FROM {} WHERE topology_id = %s AND status = 'planned' "
                                "ORDER BY txid").format(self._t("transactions")), (topology_id,))
            in_flight = [int(r[0]) for r in cur.fetchall()]
            if len(in_flight) >= spec.max_in_flight:
                raise TooManyInFlight(topology_id, in_flight, spec.max_in_flight)
            cur.execute(sql.SQL("SELECT txid, end_offsets FROM {} WHERE topology_id = %s "
                                "ORDER BY txid DESC LIMIT 1").format(self._t("transactions")), (topology_id,))
            last = cur.fetchone()
            txid, start = (int(last[0]) + 1, dict(last[1])) if last else (committed + 1, offsets)
            bp = spec.source.plan(cur, self.schema, topology_id, start, spec.max_batch_size,
                                  skip_unavailable=spec.opaque)
            batch = _stored_batch(bp)
            if bp.lost_records:
                log.warning("topology %s txid %d: %d records removed by retention were skipped (%s)",
                            topology_id, txid, bp.lost_records, "; ".join(bp.lost_detail))
            cur.execute(sql.SQL(
                "INSERT INTO {} (topology_id, txid, run_key, start_offsets, end_offsets, batch, "
                "planned_records) VALUES (%s, %s, %s, %s, %s, %s, %s)").format(self._t("transactions")),
                (topology_id, txid, run_key, Json(bp.start), Json(bp.end), Json(batch), bp.planned_records))
            log.info("topology %s: planned txid %d for run %s (%d records)", topology_id, txid,
                     run_key, bp.planned_records)
            return self._txn(cur, topology_id, txid)

    def transaction(self, topology_id: str, txid: int) -> Transaction:
        with self.db.transaction() as cur:
            return self._txn(cur, topology_id, txid)

    def transaction_for_run(self, topology_id: str, run_key: str) -> Transaction | None:
        with self.db.transaction() as cur:
            cur.execute(sql.SQL("SELECT txid FROM {} WHERE topology_id = %s AND run_key = %s")
                        .format(self._t("transactions")), (topology_id, run_key))
            row = cur.fetchone()
            return self._txn(cur, topology_id, int(row[0])) if row else None

    def replan(self, topology_id: str, from_txid: int, reason: str) -> list[int]:
        """Re-plan ``from_txid`` and every later uncommitted txid from the committed checkpoint.

        Storm's rule for opaque sources: when a batch changes, every later batch in flight is
        re-planned too, or records could be skipped or counted twice. Each re-plan is bounded by
        the txid's old end, so it only drops what retention removed; a txid whose batch comes out
        the same keeps its plan version (its staged output stays usable), and only txids the loss
        reaches must be processed again. Returns the txids whose plan changed.
        """
        changed: list[int] = []
        with self.db.transaction() as cur:
            _num, spec, committed, offsets = self._load(cur, topology_id, lock=True)
            if from_txid <= committed:
                return []
            cur.execute(sql.SQL("SELECT {} FROM {} WHERE topology_id = %s AND txid >= %s ORDER BY txid FOR UPDATE")
                        .format(_TXN_COLUMNS, self._t("transactions")),
                        (topology_id, committed + 1))
            txns = [Transaction(*r) for r in cur.fetchall()]
            prev_end = offsets
            for t in txns:
                if t.txid < from_txid or t.pinned_attempt is not None:
                    prev_end = t.end_offsets
                    continue
                # Bounded by the old end: a re-plan drops what is gone and keeps the boundary, so
                # later txids (and their staged output) stay valid unless the loss reaches them.
                bp = spec.source.plan(cur, self.schema, topology_id, prev_end, spec.max_batch_size,
                                      skip_unavailable=True, until=t.end_offsets)
                batch = _stored_batch(bp)
                if same_offsets(bp.start, t.start_offsets) and same_offsets(bp.end, t.end_offsets) \
                        and batch == t.batch:
                    prev_end = t.end_offsets
                    continue
                cur.execute(sql.SQL(
                    "UPDATE {} SET plan_version = plan_version + 1, start_offsets = %s, end_offsets = %s, "
                    "batch = %s, planned_records = %s, replanned_at = clock_timestamp(), replan_reason = %s "
                    "WHERE topology_id = %s AND txid = %s").format(self._t("transactions")),
                    (Json(bp.start), Json(bp.end), Json(batch), bp.planned_records, reason, topology_id, t.txid))
                cur.execute(sql.SQL("UPDATE {} SET status = 'discarded', finished_at = coalesce(finished_at, "
                                    "clock_timestamp()), error = %s WHERE topology_id = %s AND txid = %s "
                                    "AND status IN ('running', 'complete')").format(self._t("attempts")),
                            (f"re-planned: {reason}", topology_id, t.txid))
                changed.append(t.txid)
                prev_end = bp.end
        if changed:
            log.warning("topology %s: re-planned txids %s (%s)", topology_id, changed, reason)
        return changed

    # -- processing attempts ---------------------------------------------------------------

    def begin_attempt(self, topology_id: str, txid: int) -> tuple[Attempt, Transaction]:
        """Start a processing attempt of ``txid``; re-plans first if its batch became unreadable
        and the topology is opaque. Raises UnknownTransaction, BatchUnavailable, and
        StaleAttempt when the txid is already committed (nothing to process)."""
        with self.db.transaction() as cur:
            _num, spec, _c, _o = self._load(cur, topology_id)
            txn = self._txn(cur, topology_id, txid)
            if txn.committed:
                raise StaleAttempt(f"txid {txid} of topology {topology_id!r} is already committed "
                                   f"(at {txn.committed_at}); nothing to process")
            reason = None if txn.pinned_attempt else spec.source.unavailable(
                cur, self.schema, topology_id, txn.batch)
        if reason:
            if not spec.opaque:
                raise BatchUnavailable(
                    f"topology {topology_id!r} txid {txid}: the planned batch can no longer be read "
                    f"({reason}). The source is transactional: restore the data, or declare the "
                    "topology opaque=True so the batch is re-planned from the committed checkpoint")
            self.replan(topology_id, txid, reason)
        with self.db.transaction() as cur:
            txn = self._txn(cur, topology_id, txid, lock=True)
            cur.execute(sql.SQL("SELECT coalesce(max(attempt), 0) + 1 FROM {} WHERE topology_id = %s "
                                "AND txid = %s").format(self._t("attempts")), (topology_id, txid))
            number = int(cur.fetchone()[0])
            self._lift_failed(cur, topology_id, txid)
            cur.execute(sql.SQL("INSERT INTO {} (topology_id, txid, attempt, plan_version, status, worker) "
                                "VALUES (%s, %s, %s, %s, 'running', %s)").format(self._t("attempts")),
                        (topology_id, txid, number, txn.plan_version, self.worker))
        return Attempt(topology_id, txid, number, txn.plan_version), txn

    def check_still_readable(self, topology_id: str, txn: Transaction) -> None:
        """Raise BatchUnavailable if retention removed part of ``txn``'s batch.

        Called after an attempt has read its whole batch: retention only ever moves forward, so
        a batch still whole now was whole while it was read -- no silently short attempt.
        """
        with self.db.transaction() as cur:
            spec = self._load(cur, topology_id)[1]
            reason = spec.source.unavailable(cur, self.schema, topology_id, txn.batch)
        if reason:
            raise BatchUnavailable(f"topology {topology_id!r} txid {txn.txid}: the batch lost records while "
                                   f"it was processed ({reason}); this attempt is void -- processing it again "
                                   "re-plans it (opaque topologies) or fails naming the loss")

    def read_batch(self, txn: Transaction) -> Iterator[Record]:
        """Read a transaction's batch from its source, in source order."""
        with self.db.transaction() as cur:
            _num, spec, _c, _o = self._load(cur, txn.topology_id)
        reader = Database(self.db.dsn, application_name="airflow_transactional:read")
        try:
            with reader.transaction() as cur:
                yield from spec.source.read(cur, self.schema, txn.topology_id, txn.batch)
        finally:
            reader.close()

    def stage(self, attempt: Attempt, state_name: str, rows: Iterable[Sequence[Any]]) -> int:
        """COPY partial results ``(key..., value)`` of one state into staging; returns the count."""
        with self.db.transaction() as cur:
            num, spec, _c, _o = self._load(cur, attempt.topology_id)
            state = spec.state(state_name)
            width = len(state.keys) + 1
            buf = io.StringIO()
            n = 0
            prefix = f"{attempt.txid}\t{attempt.attempt}\t"
            for row in rows:
                if len(row) != width:
                    raise ConfigError(f"state {state_name!r} rows have {width} fields "
                                      f"({', '.join(state.key_columns)}, value), got {len(row)}: {row!r}")
                buf.write(prefix + "\t".join(map(_copy_field, row)) + "\n")
                n += 1
            buf.seek(0)
            cur.copy_expert(sql.SQL("COPY {} ({}) FROM STDIN").format(
                self._staging(num, state),
                sql.SQL(", ").join(map(sql.Identifier, q.staging_columns(state)))).as_string(cur), buf)
        return n

    def quarantine(self, attempt: Attempt, records: Iterable[tuple[str, str | None, str, str | None]]) -> int:
        """Record bad records ``(offset, event_id, reason, raw)`` of an attempt; the raw text is kept
        up to :data:`QUARANTINE_RECORD_CHARS` characters, with its full length."""
        rows = [(attempt.topology_id, attempt.txid, attempt.attempt, offset, event_id, reason[:2000],
                 None if raw is None else raw[:QUARANTINE_RECORD_CHARS], None if raw is None else len(raw))
                for offset, event_id, reason, raw in records]
        if not rows:
            return 0
        with self.db.transaction() as cur:
            cur.executemany(sql.SQL("INSERT INTO {} (topology_id, txid, attempt, source_offset, event_id, "
                                    "reason, record, record_length) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")
                            .format(self._t("quarantine")), rows)
        return len(rows)

    def quarantine_copy(self, cur: psycopg2.extensions.cursor) -> str:
        """The COPY statement that streams bad records of an attempt into the quarantine: columns
        topology_id, txid, attempt, source_offset, event_id, reason, record, record_length."""
        return q.copy_into(self._t("quarantine"), list(QUARANTINE_COLUMNS)).as_string(cur)

    def finish_attempt(self, attempt: Attempt, row_counts: Mapping[str, int], *,
                       records_read: int, quarantined: int = 0) -> None:
        """Mark an attempt complete with what it staged; refused if it was discarded meanwhile."""
        with self.db.transaction() as cur:
            cur.execute(sql.SQL(
                "UPDATE {} a SET status = 'complete', finished_at = clock_timestamp(), row_counts = %s, "
                "records_read = %s, quarantined = %s FROM {} t WHERE a.topology_id = %s AND a.txid = %s "
                "AND a.attempt = %s AND a.status = 'running' AND t.topology_id = a.topology_id "
                "AND t.txid = a.txid AND t.plan_version = a.plan_version AND t.status = 'planned'")
                .format(self._t("attempts"), self._t("transactions")),
                (Json(dict(row_counts)), records_read, quarantined, attempt.topology_id, attempt.txid,
                 attempt.attempt))
            if cur.rowcount != 1:
                raise StaleAttempt(
                    f"attempt {attempt.attempt} of txid {attempt.txid} ({attempt.topology_id}) can no "
                    "longer complete: the txid was re-planned, committed, or the attempt was discarded; "
                    "its output will not be committed (process the txid again if it is uncommitted)")

    def fail_attempt(self, attempt: Attempt, error: str) -> None:
        with self.db.transaction() as cur:
            cur.execute(sql.SQL("UPDATE {} SET status = 'failed', finished_at = clock_timestamp(), error = %s "
                                "WHERE topology_id = %s AND txid = %s AND attempt = %s AND status = 'running'")
                        .format(self._t("attempts")),
                        (error[:2000], attempt.topology_id, attempt.txid, attempt.attempt))

    def complete_attempt(self, topology_id: str, txid: int) -> tuple[int, datetime] | None:
        """Former name of :meth:`latest_complete_attempt` (kept: public since 0.1)."""
        return self.latest_complete_attempt(topology_id, txid)

    def latest_complete_attempt(self, topology_id: str, txid: int) -> tuple[int, datetime] | None:
        """(attempt, finished_at) of the latest complete attempt of the current plan, if any."""
        with self.db.transaction() as cur:
            cur.execute(sql.SQL("SELECT a.attempt, a.finished_at FROM {} a JOIN {} t USING (topology_id, txid) "
                                "WHERE a.topology_id = %s AND a.txid = %s AND a.status = 'complete' "
                                "AND a.plan_version = t.plan_version AND t.status = 'planned' "
                                "ORDER BY a.attempt DESC LIMIT 1")
                        .format(self._t("attempts"), self._t("transactions")), (topology_id, txid))
            row = cur.fetchone()
        return (int(row[0]), row[1]) if row else None

    def _lift_failed(self, cur: psycopg2.extensions.cursor, topology_id: str, txid: int) -> None:
        cur.execute(sql.SQL("UPDATE {} SET failed_at = NULL, failure = NULL WHERE topology_id = %s "
                            "AND txid = %s AND failed_at IS NOT NULL").format(self._t("transactions")),
                    (topology_id, txid))

    def retrying(self, topology_id: str, txid: int) -> None:
        """A task of ``txid``'s run runs again (a retry, a clear, a backfill): it no longer failed
        for good, so later commits wait for it again instead of failing fast."""
        with self.db.transaction() as cur:
            self._lift_failed(cur, topology_id, txid)

    def planned_runs(self, topology_id: str) -> list[tuple[int, str]]:
        """(txid, run key) of every planned, uncommitted txid, lowest first."""
        with self.db.transaction() as cur:
            cur.execute(sql.SQL("SELECT txid, run_key FROM {} WHERE topology_id = %s AND status = 'planned' "
                                "ORDER BY txid").format(self._t("transactions")), (topology_id,))
            return [(int(txid), str(key)) for txid, key in cur.fetchall()]

    def first_pending(self, topology_id: str, before_txid: int) -> tuple[int, str] | None:
        """(txid, run key) of the lowest uncommitted txid below ``before_txid``: the one that
        every later commit waits for."""
        return next(((t, k) for t, k in self.planned_runs(topology_id) if t < before_txid), None)

    def adopt(self, topology_id: str, txid: int, old_run_key: str, new_run_key: str) -> Transaction | None:
        """Hand the planned, uncommitted ``txid`` of ``old_run_key`` (a run that no longer exists)
        to ``new_run_key``: same place in the order, same batch, plan and staged attempts.

        None when another run took it first or ``new_run_key`` already has a txid. Lifts the
        failed mark: the new run is its retry.
        """
        with self.db.transaction() as cur:
            self._load(cur, topology_id, lock=True)  # one at a time with plan()
            cur.execute(sql.SQL("SELECT 1 FROM {} WHERE topology_id = %s AND run_key = %s")
                        .format(self._t("transactions")), (topology_id, new_run_key))
            if cur.fetchone() is not None:
                return None
            cur.execute(sql.SQL("UPDATE {} SET run_key = %s, failed_at = NULL, failure = NULL WHERE topology_id = %s "
                                "AND txid = %s AND run_key = %s AND status = 'planned'")
                        .format(self._t("transactions")), (new_run_key, topology_id, txid, old_run_key))
            if cur.rowcount != 1:
                return None
            log.warning("topology %s: txid %d of run %s (gone) handed to run %s", topology_id, txid,
                        old_run_key, new_run_key)
            return self._txn(cur, topology_id, txid)

    def mark_failed(self, topology_id: str, txid: int, reason: str) -> None:
        """Record that ``txid`` failed for good (no retries left), so later commits fail fast."""
        with self.db.transaction() as cur:
            cur.execute(sql.SQL("UPDATE {} SET failed_at = clock_timestamp(), failure = %s "
                                "WHERE topology_id = %s AND txid = %s AND status = 'planned'")
                        .format(self._t("transactions")), (reason[:2000], topology_id, txid))

    def blocker(self, topology_id: str, txid: int) -> str | None:
        """Why the commit of ``txid`` can never happen as things stand, or None.

        The lowest uncommitted earlier txid that failed for good blocks every later commit until
        it is cleared or backfilled (docs/design.md, trap 2: a waiting commit must not hold its slot).
        """
        with self.db.transaction() as cur:
            cur.execute(sql.SQL("SELECT txid, run_key, failure FROM {} WHERE topology_id = %s "
                                "AND txid < %s AND status = 'planned' AND failed_at IS NOT NULL "
                                "ORDER BY txid LIMIT 1").format(self._t("transactions")), (topology_id, txid))
            row = cur.fetchone()
        if row is None:
            return None
        return (f"blocked by failed txid {row[0]} (run {row[1]}): {row[2]}. Clear that run's tasks "
                "or backfill it with 'reprocess failed' (a deleted run: the next run of the DAG takes its "
                "batch over); this run can then be cleared too")

    # -- commit ----------------------------------------------------------------------------

    def _choose_attempt(self, cur: psycopg2.extensions.cursor, txn: Transaction,
                        requested: int | None) -> tuple[int | None, dict[str, int], int, int]:
        """(attempt, row_counts, records_read, quarantined) to commit, or NotProcessed."""
        if txn.pinned_attempt is not None:
            # A commit that began applying states elsewhere must finish with the same attempt.
            cur.execute(sql.SQL("SELECT attempt, row_counts, records_read, quarantined FROM {} "
                                "WHERE topology_id = %s AND txid = %s AND attempt = %s")
                        .format(self._t("attempts")), (txn.topology_id, txn.txid, txn.pinned_attempt))
            row = cur.fetchone()
            return int(row[0]), dict(row[1] or {}), int(row[2] or 0), int(row[3] or 0)
        cur.execute(sql.SQL("SELECT attempt, row_counts, records_read, quarantined FROM {} "
                            "WHERE topology_id = %s AND txid = %s AND status = 'complete' "
                            "AND plan_version = %s ORDER BY attempt DESC LIMIT 1")
                    .format(self._t("attempts")), (txn.topology_id, txn.txid, txn.plan_version))
        row = cur.fetchone()
        if row is None:
            if txn.empty and requested is None:
                return None, {}, 0, 0
            raise NotProcessed(
                f"topology {txn.topology_id!r} txid {txn.txid} has no complete processing attempt of "
                f"its current plan (version {txn.plan_version}): run its processing task, then commit")
        if requested is not None and requested != row[0]:
            raise StaleAttempt(
                f"txid {txn.txid}: attempt {requested} is not the latest complete attempt of the "
                f"current plan (that is attempt {row[0]}); only the latest can be committed")
        return int(row[0]), dict(row[1] or {}), int(row[2] or 0), int(row[3] or 0)

    def _verify_staged(self, cur: psycopg2.extensions.cursor, num: int, spec: TopologySpec,
                       txn: Transaction, attempt: int | None, row_counts: Mapping[str, int]) -> None:
        if attempt is None:
            return
        for state in spec.states:
            cur.execute(q.count_staged(self._staging(num, state)), (txn.txid, attempt))
            found = int(cur.fetchone()[0])
            expected = int(row_counts.get(state.name, 0))
            if found != expected:
                raise StagedOutputIncomplete(
                    f"topology {txn.topology_id!r} txid {txn.txid} attempt {attempt}: state "
                    f"{state.name!r} has {found} staged rows, the attempt reported {expected}; the "
                    "staged output is damaged: process the txid again (a new attempt), then commit")

    def _check_order(self, cur: psycopg2.extensions.cursor, topology_id: str, txid: int,
                     committed: int) -> CommitResult | None:
        """A no-op result when ``txid`` is already committed; an error when it must wait."""
        if txid <= committed:
            cur.execute(sql.SQL("SELECT committed_at, attempt FROM {} WHERE topology_id = %s AND txid = %s")
                        .format(self._t("commits")), (topology_id, txid))
            row = cur.fetchone()
            at, attempt = (row[0], row[1]) if row else (None, None)
            msg = (f"txid {txid} already committed at {at.isoformat() if at else 'an earlier time'}"
                   f"{f' (attempt {attempt})' if attempt is not None else ''}; nothing to do")
            return CommitResult(topology_id, txid, False, attempt, at, msg)
        if txid > committed + 1:
            raise WaitingForPredecessor(topology_id, txid, committed)
        return None

    def commit(self, topology_id: str, txid: int, attempt: int | None = None) -> CommitResult:
        """Commit ``txid`` exactly once, strictly after ``txid - 1`` (see the module docstring)."""
        with self.db.transaction() as cur:
            _num, spec, _c, _o = self._load(cur, topology_id)
        if any(s.database is not None for s in spec.states):
            done = self._commit_external(topology_id, txid, attempt)
            if done is not None:
                return done
        scope = (topology_id, str(txid))  # faults may target one topology or one txid
        with self.db.transaction() as cur:
            faults.point("commit.begin", cur, scope=scope)
            num, spec, committed, offsets = self._load(cur, topology_id, lock=True)
            started = datetime.now().astimezone()
            faults.point("commit.after_lock", cur, scope=scope)
            done = self._check_order(cur, topology_id, txid, committed)
            if done is not None:
                return done
            txn = self._txn(cur, topology_id, txid, lock=True)
            if not same_offsets(txn.start_offsets, offsets):
                raise StaleAttempt(
                    f"topology {topology_id!r}: the plan of txid {txid} starts at {txn.start_offsets} "
                    f"but the committed checkpoint is {offsets}; re-plan it (opaque topologies do "
                    "this when processing it again)")
            chosen, row_counts, records_read, quarantined = self._choose_attempt(cur, txn, attempt)
            self._verify_staged(cur, num, spec, txn, chosen, row_counts)
            faults.point("commit.after_verify", cur, scope=scope)
            for state in spec.states:
                if state.database is None and chosen is not None:
                    self._apply(cur, state, self._staging(num, state), txid, chosen,
                                int(row_counts.get(state.name, 0)))
                    faults.point("commit.after_apply", cur, scope=scope)
            lost = int((txn.batch.get("lost") or {}).get("records", 0))
            cur.execute("SELECT clock_timestamp()")  # one time for the commit, wherever it is recorded
            committed_at = cur.fetchone()[0]
            cur.execute(sql.SQL("UPDATE {} SET committed_txid = %s, committed_offsets = %s, "
                                "last_commit_at = %s, lost_records = lost_records + %s "
                                "WHERE topology_id = %s").format(self._t("topologies")),
                        (txid, Json(txn.end_offsets), committed_at, lost, topology_id))
            cur.execute(sql.SQL("UPDATE {} SET status = 'committed', committed_at = %s "
                                "WHERE topology_id = %s AND txid = %s").format(self._t("transactions")),
                        (committed_at, topology_id, txid))
            cur.execute(sql.SQL("UPDATE {} SET status = CASE WHEN attempt = %s THEN 'committed' "
                                "ELSE 'discarded' END, finished_at = coalesce(finished_at, clock_timestamp()) "
                                "WHERE topology_id = %s AND txid = %s AND status <> 'failed'")
                        .format(self._t("attempts")), (chosen, topology_id, txid))
            cur.execute(sql.SQL("DELETE FROM {} WHERE topology_id = %s AND txid = %s "
                                "AND attempt IS DISTINCT FROM %s").format(self._t("quarantine")),
                        (topology_id, txid, chosen))
            cur.execute(sql.SQL("UPDATE {} SET committed = true WHERE topology_id = %s AND txid = %s")
                        .format(self._t("quarantine")), (topology_id, txid))
            cur.execute(sql.SQL(
                "INSERT INTO {} (topology_id, txid, attempt, plan_version, run_key, start_offsets, "
                "end_offsets, records_read, row_counts, quarantined, committer, commit_started_at, committed_at) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")
                .format(self._t("commits")),
                (topology_id, txid, chosen or 0, txn.plan_version, txn.run_key, Json(txn.start_offsets),
                 Json(txn.end_offsets), records_read, Json(row_counts), quarantined, self.worker, started,
                 committed_at))
            faults.point("commit.after_checkpoint", cur, scope=scope)
            cur.execute(sql.SQL("SELECT rebuild_from_txid FROM {} WHERE topology_id = %s")
                        .format(self._t("topologies")), (topology_id,))
            if cur.fetchone()[0] is None:  # during a rebuild the staged rows are its journal
                for state in spec.states:
                    cur.execute(q.delete_staged_txid(self._staging(num, state)), (txid,))
            faults.point("commit.before_commit", cur, scope=scope)
        faults.point("commit.after_commit", scope=scope)
        what = f"attempt {chosen}" if chosen is not None else "empty batch"
        msg = f"committed txid {txid} ({what}) of topology {topology_id}"
        return CommitResult(topology_id, txid, True, chosen, committed_at, msg)

    def _apply(self, cur: psycopg2.extensions.cursor, state: StateSpec, staging: sql.Composed,
               txid: int, attempt: int, expected: int) -> None:
        delta = q.staged_delta(staging, state)
        params = {"txid": txid, "attempt": attempt}
        cur.execute(q.upsert(state, q.state_table(state), delta), params)
        if cur.rowcount < expected:
            cur.execute(q.rows_ahead(state, q.state_table(state), delta), params)
            ahead = int(cur.fetchone()[0])
            if ahead:
                raise ReplayBehindState(
                    f"state {state.name!r}: {ahead} keys already hold a txid later than {txid}; a replay "
                    "behind the state is never applied. The state table was changed outside this "
                    "topology (or restored from a later backup): rebuild it from the source")

    def _commit_external(self, topology_id: str, txid: int, attempt: int | None) -> CommitResult | None:
        """Apply states kept in other databases; the attempt is pinned first so a crash and rerun
        re-applies exactly the same staged rows (idempotent under the per-value txid rule)."""
        with self.db.transaction() as cur:
            num, spec, committed, _o = self._load(cur, topology_id, lock=True)
            done = self._check_order(cur, topology_id, txid, committed)
            if done is not None:
                return done
            txn = self._txn(cur, topology_id, txid, lock=True)
            chosen, row_counts, _r, _q = self._choose_attempt(cur, txn, attempt)
            self._verify_staged(cur, num, spec, txn, chosen, row_counts)
            if chosen is None:
                return None
            cur.execute(sql.SQL("UPDATE {} SET pinned_attempt = %s WHERE topology_id = %s AND txid = %s")
                        .format(self._t("transactions")), (chosen, topology_id, txid))
        faults.point("commit.after_pin")
        for state in spec.states:
            if state.database is None:
                continue
            buf = io.StringIO()
            with self.db.transaction() as cur:
                copy = sql.SQL("COPY ({}) TO STDOUT").format(q.staged_delta(self._staging(num, state), state))
                cur.copy_expert(cur.mogrify(copy, {"txid": txid, "attempt": chosen}).decode(), buf)
            buf.seek(0)
            with self._ext_db(state.database).transaction() as ecur:
                self._ensure_state_table(ecur, state)
                ecur.execute(sql.SQL("CREATE TEMP TABLE txn_delta ({}, value {}) ON COMMIT DROP").format(
                    sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t))
                                       for c, t in state.keys.items()), sql.SQL(state.value_type)))
                ecur.copy_expert("COPY txn_delta FROM STDIN", buf)
                delta = sql.SQL("SELECT * FROM txn_delta")
                ecur.execute(q.upsert(state, q.state_table(state), delta), {"txid": txid})
                ecur.execute(q.rows_ahead(state, q.state_table(state), delta), {"txid": txid})
                if int(ecur.fetchone()[0]):
                    raise ReplayBehindState(
                        f"state {state.name!r} in database {state.database!r} holds txids later than "
                        f"{txid}: it was changed outside this topology; rebuild it from the source")
            faults.point("commit.after_external")
        return None

    # -- recovery --------------------------------------------------------------------------

    def recover(self, topology_id: str) -> RecoverResult:
        """Discard staged output that can never be committed; safe to run at any time.

        Kept: rows of running attempts and of the latest complete attempt of each uncommitted
        txid's current plan (and a pinned attempt). Everything else -- failed, discarded,
        superseded, outdated-plan, committed-txid and orphaned rows -- is deleted.
        """
        result = RecoverResult()
        with self.db.transaction() as cur:
            num, spec, _committed, _o = self._load(cur, topology_id, lock=True)
            a, t = self._t("attempts"), self._t("transactions")
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
            ).format(a=a, t=t, topo=self._t("topologies"))
            for state in spec.states:
                cur.execute(sql.SQL("DELETE FROM {} s WHERE NOT {}").format(self._staging(num, state), keep),
                            (topology_id, topology_id))
                if cur.rowcount:
                    result.details.append(f"{state.name}: {cur.rowcount} staged rows")
                result.staged_rows_deleted += cur.rowcount
            cur.execute(sql.SQL("DELETE FROM {q} s WHERE s.topology_id = %s AND NOT s.committed AND NOT "
                                "EXISTS (SELECT 1 FROM {a} x WHERE x.topology_id = s.topology_id AND "
                                "x.txid = s.txid AND x.attempt = s.attempt AND x.status IN ('running', 'complete'))")
                        .format(q=self._t("quarantine"), a=a), (topology_id,))
            result.quarantine_rows_deleted = cur.rowcount
        if result.staged_rows_deleted or result.attempts_discarded:
            log.info("topology %s: recover discarded %d attempts and %d staged rows", topology_id,
                     result.attempts_discarded, result.staged_rows_deleted)
        return result

    # -- status ----------------------------------------------------------------------------

    def status(self, topology_id: str) -> TopologyStatus:
        with self.db.transaction() as cur:
            _num, spec, committed, offsets = self._load(cur, topology_id)
            cur.execute(sql.SQL("SELECT last_commit_at, lost_records FROM {} WHERE topology_id = %s")
                        .format(self._t("topologies")), (topology_id,))
            last_commit_at, lost = cur.fetchone()
            cur.execute(sql.SQL(
                "SELECT t.txid, t.run_key, t.plan_version, t.batch, "
                "(SELECT count(*) FROM {a} x WHERE x.topology_id = t.topology_id AND x.txid = t.txid), "
                "(SELECT array[x.status, x.error] FROM {a} x WHERE x.topology_id = t.topology_id AND "
                "x.txid = t.txid AND x.plan_version = t.plan_version ORDER BY x.attempt DESC LIMIT 1) "
                "FROM {t} t WHERE t.topology_id = %s AND t.status = 'planned' ORDER BY t.txid")
                .format(a=self._t("attempts"), t=self._t("transactions")), (topology_id,))
            in_flight = []
            for txid, run_key, version, _batch, n_attempts, latest in cur.fetchall():
                st, err = latest if latest else (None, None)
                phase = {"running": "processing", "complete": "processed", "failed": "failed"}.get(
                    st or "", "planned")
                in_flight.append(InFlight(int(txid), run_key, phase, int(version), int(n_attempts),
                                          err if phase == "failed" else None))
            cur.execute(sql.SQL("SELECT count(*) FILTER (WHERE committed), count(*) FILTER (WHERE NOT committed) "
                                "FROM {} WHERE topology_id = %s").format(self._t("quarantine")), (topology_id,))
            q_done, q_pending = cur.fetchone()
            lag = spec.source.lag(cur, self.schema, topology_id, offsets)
        blocked = self.blocker(topology_id, committed + 2)
        nxt = next((f for f in in_flight if f.txid == committed + 1), None)
        if blocked is None and nxt is not None and nxt.phase == "failed":
            blocked = (f"blocked by failed txid {nxt.txid} (run {nxt.run_key}): {nxt.error}; clear or "
                       "backfill that run to process it again (Airflow retries it first if retries are left)")
        return TopologyStatus(topology_id, committed, offsets, last_commit_at, in_flight, int(lag),
                              blocked, int(q_done), int(q_pending), int(lost))

    # -- audit ------------------------------------------------------------------------------

    def topology_num(self, cur: psycopg2.extensions.cursor, topology_id: str) -> int:
        return self._load(cur, topology_id)[0]

    def committed_batch(self, topology_id: str, through_txid: int | None = None
                        ) -> tuple[dict[str, Any], str | None]:
        """A batch covering everything committed (through ``through_txid``), or why it cannot be
        recomputed from the source."""
        with self.db.transaction() as cur:
            _num, spec, committed, offsets = self._load(cur, topology_id)
            if through_txid is not None and through_txid != committed:
                cur.execute(sql.SQL("SELECT end_offsets FROM {} WHERE topology_id = %s AND txid = %s")
                            .format(self._t("commits")), (topology_id, through_txid))
                row = cur.fetchone()
                offsets = dict(row[0]) if row else {}
            cur.execute(sql.SQL("SELECT batch->'lost'->'ranges' FROM {} WHERE topology_id = %s AND txid <= %s "
                                "AND status = 'committed' AND batch ? 'lost'").format(self._t("transactions")),
                        (topology_id, committed if through_txid is None else through_txid))
            lost = [r for (ranges,) in cur.fetchall() for r in (ranges or [])]
            return spec.source.committed_batch(cur, self.schema, topology_id, offsets, lost)

    def create_audit_table(self, num: int, state: StateSpec) -> sql.Composed:
        table = q.audit_table(self.schema, num, state)
        with self.db.transaction() as cur:
            for stmt in q.create_audit_table(table, state):
                cur.execute(stmt)
        return table

    def diff_audit(self, topology_id: str, num: int, committed_txid: int, samples: int = 10
                   ) -> dict[str, Any] | None:
        """Diff the recomputed states against the state tables, holding commits off meanwhile.

        Returns None when a commit landed since ``committed_txid`` (recompute and try again).
        """
        with self.db.transaction() as cur:
            cur.execute(sql.SQL("SELECT committed_txid FROM {} WHERE topology_id = %s FOR SHARE")
                        .format(self._t("topologies")), (topology_id,))
            if int(cur.fetchone()[0]) != committed_txid:
                return None
            spec = self._load(cur, topology_id)[1]
            result: dict[str, Any] = {"topology": topology_id, "auditable": True,
                                      "committed_txid": committed_txid, "differences": 0,
                                      "states": {}, "samples": []}
            for state in spec.states:
                table = q.audit_table(self.schema, num, state)
                cur.execute(q.audit_diff(state, table))
                rows = cur.fetchall()
                cur.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
                result["states"][state.name] = {"keys": int(cur.fetchone()[0]), "differences": len(rows)}
                result["differences"] += len(rows)
                result["samples"] += [f"{state.name}[{k}]: stored {s}, recomputed {r}" for k, s, r in rows[:samples]]
                cur.execute(sql.SQL("DROP TABLE {}").format(table))
        return result

    def commits(self, topology_id: str) -> list[dict[str, Any]]:
        """The audit log of a topology, in txid order."""
        with self.db.transaction() as cur:
            self._load(cur, topology_id)  # UnknownTopology, not an empty log, for a wrong name
            cur.execute(sql.SQL("SELECT txid, attempt, plan_version, run_key, start_offsets, end_offsets, "
                                "records_read, row_counts, quarantined, committer, commit_started_at, "
                                "committed_at FROM {} WHERE topology_id = %s ORDER BY txid")
                        .format(self._t("commits")), (topology_id,))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
