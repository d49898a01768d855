"""The state store one coordinator works on: its database, its schema, and the lookups every
step of the protocol shares (a topology's row, a transaction's row, table names)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import NamedTuple

import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from .. import identifiers
from ..connections import Connections
from ..exceptions import ConfigError, UnknownTopology, UnknownTransaction
from ..model import VERIFY_ATTEMPT, Offsets, Transaction
from ..spec import DecisionSpec, StateSpec, TopologySpec
from ..store import decisions, outputs, topologies, transactions, turns
from ..store import state as q
from ..store.connection import Database


class Loaded(NamedTuple):
    """A topology as a step of the protocol reads it."""

    num: int  # names its staging tables
    spec: TopologySpec
    committed_txid: int
    committed_offsets: Offsets


class StateStore:
    """One state store: ``dsn`` is its database, ``schema`` the provider's schema in it;
    ``external_dsns`` maps the ``database`` names of states kept elsewhere to their DSNs (never
    stored, never logged)."""

    def __init__(self, dsn: str, *, schema: str, external_dsns: Mapping[str, str] | None = None,
                 worker: str | None = None, connections: Connections | None = None) -> None:
        self.schema = identifiers.name("schema name", schema)
        self.connections = connections or Connections()  # where a source's or an output's Kafka settings come from
        self.db = Database(dsn)
        self.external_dsns = dict(external_dsns or {})
        self.external: dict[str, Database] = {}
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.held: dict[str, turns.Held] = {}  # turns this store holds across transactions (a rebuild's)
        self.specs: dict[str, tuple[int, TopologySpec]] = {}  # topology id -> (num, spec), as last read

    def close(self) -> None:
        for held in self.held.values():  # as a session lock ended with its session
            held.release()
        self.held.clear()
        self.db.close()
        for ext in self.external.values():
            ext.close()

    def staging(self, num: int, state: StateSpec) -> sql.Composed:
        """The staging table of a state of topology number ``num``."""
        return q.staging_table(self.schema, num, state)

    def verify_staging(self, num: int, state: StateSpec) -> sql.Composed:
        """Where a round of the shadow audit stages its recomputation of a state (attempt -1)."""
        return q.verify_table(self.schema, num, state)

    def staging_of(self, num: int, state: StateSpec, attempt: int) -> sql.Composed:
        """Where ``attempt`` of a state is staged: a verification's apart (:meth:`verify_staging`)."""
        return self.verify_staging(num, state) if attempt == VERIFY_ATTEMPT else self.staging(num, state)

    def decision_staging(self, num: int, decision: DecisionSpec) -> sql.Composed:
        """The staging table of the requests of a decision of topology number ``num``."""
        return decisions.staging_table(self.schema, num, decision)

    def decision_runs(self, num: int, decision: DecisionSpec) -> sql.Composed:
        """The runs of requests per key of a decision's completed attempts (topology number ``num``)."""
        return decisions.runs_table(self.schema, num, decision)

    def out_staging(self, num: int) -> sql.Composed:
        """The staging table of the output events of topology number ``num``."""
        return outputs.staging_table(self.schema, num)

    def out_verify(self, num: int) -> sql.Composed:
        """Where a round of the shadow audit stages the output events it recomputed (attempt -1)."""
        return outputs.verify_table(self.schema, num)

    def out_staging_of(self, num: int, attempt: int) -> sql.Composed:
        return self.out_verify(num) if attempt == VERIFY_ATTEMPT else self.out_staging(num)

    def external_db(self, name: str) -> Database:
        """The database of states declared with ``database=name``."""
        if name not in self.external:
            if name not in self.external_dsns:
                raise ConfigError(
                    f"state database {name!r} is not configured: pass "
                    f"Coordinator(external_dsns={{{name!r}: dsn}}) (the DAG API maps it from a connection)")
            self.external[name] = Database(self.external_dsns[name])
        return self.external[name]

    def load(self, cur: psycopg2.extensions.cursor, topology_id: str, *, lock: bool = False) -> Loaded:
        """A topology's number, declaration and checkpoint; ``lock`` takes its row lock, which
        serialises plans and commits of the topology."""
        try:
            row = topologies.get(cur, self.schema, topology_id, lock=lock)
        except psycopg2.errors.UndefinedTable:
            raise UnknownTopology(topology_id, f"this database has no provider schema {self.schema!r} (is it the "
                                  "right database and --schema?)") from None
        if row is None:
            raise UnknownTopology(topology_id)
        cached = self.specs.get(topology_id)
        if cached is None or cached[1].to_config() != row.spec:
            cached = (int(row.num), TopologySpec.from_config(row.spec, self.connections))
            self.specs[topology_id] = cached
        return Loaded(cached[0], cached[1], int(row.committed_txid), dict(row.committed_offsets))

    def txn(self, cur: psycopg2.extensions.cursor, topology_id: str, txid: int, *,
            lock: bool = False) -> Transaction:
        """The transaction ``txid`` of a topology (``lock``: its row lock)."""
        row = transactions.get(cur, self.schema, topology_id, txid, lock=lock)
        if row is None:
            raise UnknownTransaction(f"topology {topology_id!r} has no txid {txid}: plan it first")
        return row
