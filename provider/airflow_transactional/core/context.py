"""The state store one coordinator works on: its database, its schema, and the lookups every
step of the protocol shares (a topology's row, a transaction's row, table names)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from .. import identifiers
from ..exceptions import ConfigError, UnknownTopology, UnknownTransaction
from ..sources.base import Offsets
from ..spec import StateSpec, TopologySpec
from ..store import sql as q
from ..store.connection import Database
from .model import Transaction

TXN_COLUMNS = sql.SQL("topology_id, txid, run_key, plan_version, start_offsets, end_offsets, batch, "
                      "planned_records, status, planned_at, committed_at, pinned_attempt")
FOR_UPDATE = {True: sql.SQL("FOR UPDATE"), False: sql.SQL("")}


class StateStore:
    """One state store: ``dsn`` is its database, ``schema`` the provider's schema in it;
    ``external_dsns`` maps the ``database`` names of states kept elsewhere to their DSNs (never
    stored, never logged)."""

    def __init__(self, dsn: str, *, schema: str, external_dsns: Mapping[str, str] | None = None,
                 worker: str | None = None) -> None:
        self.schema = identifiers.name("schema name", schema)
        self.db = Database(dsn)
        self.external_dsns = dict(external_dsns or {})
        self.external: dict[str, Database] = {}
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.specs: dict[str, tuple[int, TopologySpec]] = {}  # topology id -> (num, spec), as last read

    def close(self) -> None:
        self.db.close()
        for ext in self.external.values():
            ext.close()

    def t(self, table: str) -> sql.Composed:
        """A table of the provider's schema."""
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(table))

    def staging(self, num: int, state: StateSpec) -> sql.Composed:
        """The staging table of a state of topology number ``num``."""
        return q.staging_table(self.schema, num, state)

    def ext_db(self, name: str) -> Database:
        """The database of states declared with ``database=name``."""
        if name not in self.external:
            if name not in self.external_dsns:
                raise ConfigError(
                    f"state database {name!r} is not configured: pass "
                    f"Coordinator(external_dsns={{{name!r}: dsn}}) (the DAG API maps it from a connection)")
            self.external[name] = Database(self.external_dsns[name])
        return self.external[name]

    @staticmethod
    def exists(cur: psycopg2.extensions.cursor, table: sql.Composed) -> bool:
        """Whether ``table`` exists. Checked before each CREATE: ``CREATE ... IF NOT EXISTS`` needs
        the CREATE privilege even when there is nothing to create, and a run-time role has none."""
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table.as_string(cur),))
        return bool(cur.fetchone()[0])

    def load(self, cur: psycopg2.extensions.cursor, topology_id: str, *, lock: bool = False
             ) -> tuple[int, TopologySpec, int, Offsets]:
        """(number, declaration, committed txid, committed offsets) of a topology; ``lock`` takes
        its row lock, which serialises plans and commits of the topology."""
        try:
            cur.execute(sql.SQL("SELECT num, spec, committed_txid, committed_offsets FROM {} WHERE topology_id = %s {}")
                        .format(self.t("topologies"), FOR_UPDATE[lock]), (topology_id,))
        except psycopg2.errors.UndefinedTable:
            raise UnknownTopology(topology_id, f"this database has no provider schema {self.schema!r} (is it the "
                                  "right database and --schema?)") from None
        row = cur.fetchone()
        if row is None:
            raise UnknownTopology(topology_id)
        num, spec_cfg, committed, offsets = row
        cached = self.specs.get(topology_id)
        if cached is None or cached[1].to_config() != spec_cfg:
            cached = (int(num), TopologySpec.from_config(spec_cfg))
            self.specs[topology_id] = cached
        return cached[0], cached[1], int(committed), dict(offsets)

    def txn(self, cur: psycopg2.extensions.cursor, topology_id: str, txid: int, *,
            lock: bool = False) -> Transaction:
        """The transaction ``txid`` of a topology (``lock``: its row lock)."""
        cur.execute(sql.SQL("SELECT {} FROM {} WHERE topology_id = %s AND txid = %s {}")
                    .format(TXN_COLUMNS, self.t("transactions"), FOR_UPDATE[lock]), (topology_id, txid))
        row = cur.fetchone()
        if row is None:
            raise UnknownTransaction(f"topology {topology_id!r} has no txid {txid}: plan it first")
        return Transaction(*row)
