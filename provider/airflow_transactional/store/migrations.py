"""Versioned, idempotent migrations of the provider's own schema (never ``public``).

Each migration runs once, in order, in the transaction that records it, under an advisory lock
so concurrent workers starting at once do not race. Migrating needs only ownership of the
schema (or CREATE on the database to create it), no superuser; once the schema is up to date
nothing here runs DDL, so a run-time role with DML rights alone works (README "Security and
bad input").
"""

from __future__ import annotations

import logging
import zlib

from psycopg2 import sql

from .. import identifiers
from . import catalog
from .connection import Database
from .rows import table

log = logging.getLogger(__name__)

DEFAULT_SCHEMA = "airflow_txn"

# (version, name, statements). Never edit a released migration: add a new one.
MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "transaction core",
        """
CREATE TABLE {s}.topologies (
    topology_id      text PRIMARY KEY,
    num              serial UNIQUE,
    spec             jsonb NOT NULL,
    committed_txid   bigint NOT NULL DEFAULT 0,
    committed_offsets jsonb NOT NULL DEFAULT '{{}}',
    last_commit_at   timestamptz,
    lost_records     bigint NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE {s}.transactions (
    topology_id    text NOT NULL REFERENCES {s}.topologies ON DELETE CASCADE,
    txid           bigint NOT NULL CHECK (txid > 0),
    run_key        text NOT NULL,
    plan_version   integer NOT NULL DEFAULT 1,
    start_offsets  jsonb NOT NULL,
    end_offsets    jsonb NOT NULL,
    batch          jsonb NOT NULL,
    planned_records bigint NOT NULL,
    status         text NOT NULL DEFAULT 'planned' CHECK (status IN ('planned', 'committed')),
    planned_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    replanned_at   timestamptz,
    replan_reason  text,
    pinned_attempt integer,
    committed_at   timestamptz,
    PRIMARY KEY (topology_id, txid),
    UNIQUE (topology_id, run_key)
);
CREATE INDEX ON {s}.transactions (topology_id, status, txid);
CREATE TABLE {s}.attempts (
    topology_id   text NOT NULL,
    txid          bigint NOT NULL,
    attempt       integer NOT NULL CHECK (attempt > 0),
    plan_version  integer NOT NULL,
    status        text NOT NULL CHECK (status IN ('running', 'complete', 'failed', 'discarded', 'committed')),
    started_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at   timestamptz,
    row_counts    jsonb,
    records_read  bigint,
    quarantined   bigint NOT NULL DEFAULT 0,
    worker        text,
    error         text,
    PRIMARY KEY (topology_id, txid, attempt),
    FOREIGN KEY (topology_id, txid) REFERENCES {s}.transactions ON DELETE CASCADE
);
CREATE TABLE {s}.commits (
    topology_id    text NOT NULL REFERENCES {s}.topologies ON DELETE CASCADE,
    txid           bigint NOT NULL,
    attempt        integer NOT NULL,
    plan_version   integer NOT NULL,
    run_key        text NOT NULL,
    start_offsets  jsonb NOT NULL,
    end_offsets    jsonb NOT NULL,
    records_read   bigint NOT NULL,
    row_counts     jsonb NOT NULL,
    quarantined    bigint NOT NULL,
    committer      text,
    commit_started_at timestamptz NOT NULL,
    committed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (topology_id, txid)
);
CREATE TABLE {s}.quarantine (
    id            bigserial PRIMARY KEY,
    topology_id   text NOT NULL,
    txid          bigint NOT NULL,
    attempt       integer NOT NULL,
    source_offset text NOT NULL,
    event_id      text,
    reason        text NOT NULL,
    record        text,
    committed     boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON {s}.quarantine (topology_id, txid, attempt);
CREATE TABLE {s}.logs (
    log_name    text PRIMARY KEY,
    partitions  integer NOT NULL CHECK (partitions > 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE {s}.log_partitions (
    log_name          text NOT NULL REFERENCES {s}.logs ON DELETE CASCADE,
    partition         integer NOT NULL,
    next_lsn          bigint NOT NULL DEFAULT 1,
    truncated_through bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (log_name, partition)
);
CREATE TABLE {s}.log_events (
    log_name    text NOT NULL,
    partition   integer NOT NULL,
    lsn         bigint NOT NULL,
    event_id    text NOT NULL,
    payload     text NOT NULL,
    appended_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (log_name, partition, lsn)
);
CREATE UNIQUE INDEX log_events_event_id ON {s}.log_events (log_name, event_id);
CREATE TABLE {s}.landing_files (
    topology_id   text NOT NULL REFERENCES {s}.topologies ON DELETE CASCADE,
    seq           bigint NOT NULL,
    path          text NOT NULL,
    size          bigint NOT NULL,
    mtime         double precision NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topology_id, seq),
    UNIQUE (topology_id, path)
);
""",
    ),
    (
        2,
        "failed transactions, retired event ids",
        """
-- Ids of events removed by retention: dedupe must outlive the events themselves, or a late
-- duplicate delivery would be appended (and counted) again.
CREATE TABLE {s}.log_retired_ids (
    log_name    text NOT NULL,
    event_id    text NOT NULL,
    PRIMARY KEY (log_name, event_id)
);
-- A transaction whose processing or commit failed for good (Airflow gave up retrying). Later
-- commits waiting on it fail fast instead of holding max_active_runs slots (DESIGN.md trap 2);
-- planning or processing it again (a clear, a backfill) lifts the mark.
ALTER TABLE {s}.transactions ADD COLUMN failed_at timestamptz, ADD COLUMN failure text;
""",
    ),
    (
        3,
        "rebuilds",
        """
-- While a rebuild recomputes the states as of this txid, commits keep their staged rows (the
-- journal the rebuild replays before it swaps the new states in).
ALTER TABLE {s}.topologies ADD COLUMN rebuild_from_txid bigint;
""",
    ),
    (
        4,
        "landing files by content, rebuild owners",
        """
-- A landing file is known by its content, not its name: a file replaced under the same name is
-- a new version (a new seq), and a planned file whose content changed is unavailable.
ALTER TABLE {s}.landing_files ADD COLUMN mtime_ns bigint, ADD COLUMN inode bigint, ADD COLUMN sha256 text;
ALTER TABLE {s}.landing_files DROP CONSTRAINT landing_files_topology_id_path_key;
CREATE INDEX ON {s}.landing_files (topology_id, path, seq);
-- Each rebuild has an id: only the rebuild that began can swap its tables in.
ALTER TABLE {s}.topologies ADD COLUMN rebuild_id text;
-- A quarantined record keeps a prefix of its raw text (QUARANTINE_RECORD_CHARS) and its full length:
-- one poison record of a gigabyte must not travel to the driver or into this table whole.
ALTER TABLE {s}.quarantine ADD COLUMN record_length bigint;
""",
    ),
    (
        5,
        "decisions in commit order",
        """
-- The verdict on every request a decision rule took, in the commit of the txid that decided it:
-- a requester's status, and why a request sent again is not decided again.
-- One index, on the request id alone as bytes (COLLATE "C"): a commit inserts a row per request,
-- so each extra index or foreign-key check costs every request (reset deletes the rows itself).
CREATE TABLE {s}.verdicts (
    topology_id   text COLLATE "C" NOT NULL,
    decision      text COLLATE "C" NOT NULL,
    request_id    text COLLATE "C" NOT NULL,
    txid          bigint NOT NULL,
    seq           bigint,
    key           jsonb NOT NULL,
    amount        numeric NOT NULL,
    granted       boolean NOT NULL,
    balance_after numeric NOT NULL,
    PRIMARY KEY (topology_id, decision, request_id)
);
-- One key's requests in order: granted when the amount is not negative or the balance stays at
-- or above the floor (a declined one leaves it as it was); the balance after each request.
CREATE FUNCTION {s}.guarded_run(start numeric, floor numeric, amounts numeric[],
                                OUT grants boolean[], OUT balances numeric[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $body$
DECLARE
    balance numeric := start;
    amount numeric;
BEGIN
    grants := ARRAY[]::boolean[];
    balances := ARRAY[]::numeric[];
    FOREACH amount IN ARRAY amounts LOOP
        IF amount >= 0 OR balance + amount >= floor THEN
            balance := balance + amount;
            grants := grants || true;
        ELSE
            grants := grants || false;
        END IF;
        balances := balances || balance;
    END LOOP;
END
$body$;
""",
    ),
    (
        6,
        "decisions recorded where they are cheap to write",
        """
-- A commit used to write one verdicts row per request. Now the processing attempt records its
-- requests when it completes (in parallel with other txids), and the commit writes one row per
-- key: the committed balance the key's run started from, and its verdicts only when one of them
-- is a decline. ``verdicts`` becomes a view over both with the columns it had.
ALTER TABLE {s}.verdicts RENAME TO verdicts_v5;
-- The requests an attempt will decide: not decided by a txid committed when it completed, in
-- the order of their key's run (``prefix``: the run's sum up to this request, all granted).
CREATE TABLE {s}.decision_requests (
    topology_id   text COLLATE "C" NOT NULL,
    decision      text COLLATE "C" NOT NULL,
    request_id    text COLLATE "C" NOT NULL,
    txid          bigint NOT NULL,
    attempt       integer NOT NULL,
    seq           bigint,
    key           jsonb NOT NULL,
    amount        numeric NOT NULL,
    prefix        numeric NOT NULL,
    PRIMARY KEY (topology_id, decision, request_id, txid, attempt)
);
-- Requests are probed by id; a block-range index finds a txid's rows (recorded in txid order
-- mostly) and is never a candidate for those probes, whatever the statistics say.
CREATE INDEX decision_requests_by_txid ON {s}.decision_requests USING brin (txid) WITH (pages_per_range = 16);
-- Per attempt: the txid committed when its requests were recorded (those committed after it
-- are checked again by its commit), and how many it staged (the commit verifies the count).
CREATE TABLE {s}.decision_checks (
    topology_id     text COLLATE "C" NOT NULL,
    decision        text COLLATE "C" NOT NULL,
    txid            bigint NOT NULL,
    attempt         integer NOT NULL,
    checked_through bigint NOT NULL,
    staged          bigint NOT NULL,
    PRIMARY KEY (topology_id, decision, txid, attempt)
);
-- Per committed txid and key: the balance its run started from; ``requests``, ``grants`` and
-- ``balances`` only for a run that had to be decided request by request (NULL: all granted).
-- A block-range index: appended in txid order, it costs the commit nearly nothing.
CREATE TABLE {s}.decision_runs (
    topology_id   text COLLATE "C" NOT NULL,
    decision      text COLLATE "C" NOT NULL,
    txid          bigint NOT NULL,
    attempt       integer NOT NULL,
    key           jsonb NOT NULL,
    start         numeric NOT NULL,
    requests      text[],
    grants        boolean[],
    balances      numeric[]
);
CREATE INDEX decision_runs_by_txid ON {s}.decision_runs USING brin (txid) WITH (pages_per_range = 16);
CREATE VIEW {s}.verdicts AS
SELECT r.topology_id, r.decision, r.request_id, r.txid, r.seq, r.key, r.amount,
       coalesce(u.grants[array_position(u.requests, r.request_id::text)], true) AS granted,
       coalesce(u.balances[array_position(u.requests, r.request_id::text)], u.start + r.prefix) AS balance_after
FROM {s}.decision_requests r
JOIN {s}.decision_runs u ON u.txid = r.txid AND u.topology_id = r.topology_id AND u.decision = r.decision
 AND u.attempt = r.attempt AND u.key = r.key
UNION ALL
SELECT topology_id, decision, request_id, txid, seq, key, amount, granted, balance_after FROM {s}.verdicts_v5;
""",
    ),
    (
        7,
        "decision conflicts found when attempts complete; runs with every debit declined",
        """
-- A commit whose attempt completed before the txids ahead of it were committed used to probe
-- each of its requests again. Now completing attempts find the requests they share with
-- uncommitted txids (completions of one decision take turns), and the commit settles only those.
-- A row: attempt (txid, attempt) staged request_id, and an attempt of another uncommitted txid
-- staged it too; the commit keeps it when no txid committed before decided it, else leaves it
-- out. The attempt did not record it when the other txid is earlier (a tentative exclusion).
CREATE TABLE {s}.decision_conflicts (
    topology_id   text COLLATE "C" NOT NULL,
    decision      text COLLATE "C" NOT NULL,
    request_id    text COLLATE "C" NOT NULL,
    txid          bigint NOT NULL,
    attempt       integer NOT NULL,
    seq           bigint,
    key           jsonb NOT NULL,
    amount        numeric NOT NULL,
    PRIMARY KEY (topology_id, decision, request_id, txid, attempt)
);
-- Attempts recorded before this version checked only the txids committed when they completed
-- (``checked_through``): their requests that a txid between that and their own recorded too
-- become conflicts, so their commits settle them as the old check did.
INSERT INTO {s}.decision_conflicts (topology_id, decision, request_id, txid, attempt, seq, key, amount)
SELECT r.topology_id, r.decision, r.request_id, r.txid, r.attempt, r.seq, r.key, r.amount
FROM {s}.decision_checks c
JOIN {s}.decision_requests r USING (topology_id, decision, txid, attempt)
JOIN {s}.topologies t ON t.topology_id = c.topology_id AND c.txid > t.committed_txid
WHERE c.checked_through < c.txid - 1 AND EXISTS (
    SELECT 1 FROM {s}.decision_requests o WHERE o.topology_id = r.topology_id AND o.decision = r.decision
    AND o.request_id = r.request_id AND o.txid > c.checked_through AND o.txid < r.txid);
-- A key whose every debit is declined (its balance too low even with the credits before each)
-- is decided in one comparison too; its row keeps no arrays. The balance after a request is then
-- the start plus the credits up to it (``cprefix``).
ALTER TABLE {s}.decision_requests ADD COLUMN cprefix numeric;
ALTER TABLE {s}.decision_runs ADD COLUMN debits_declined boolean;
CREATE OR REPLACE VIEW {s}.verdicts AS
SELECT r.topology_id, r.decision, r.request_id, r.txid, r.seq, r.key, r.amount,
       CASE WHEN u.debits_declined THEN r.amount >= 0
            ELSE coalesce(u.grants[array_position(u.requests, r.request_id::text)], true) END AS granted,
       CASE WHEN u.debits_declined THEN u.start + coalesce(r.cprefix, 0)
            ELSE coalesce(u.balances[array_position(u.requests, r.request_id::text)], u.start + r.prefix)
       END AS balance_after
FROM {s}.decision_requests r
JOIN {s}.decision_runs u ON u.txid = r.txid AND u.topology_id = r.topology_id AND u.decision = r.decision
 AND u.attempt = r.attempt AND u.key = r.key
UNION ALL
SELECT topology_id, decision, request_id, txid, seq, key, amount, granted, balance_after FROM {s}.verdicts_v5;
""",
    ),
]


def _lock_key(schema: str) -> int:
    return zlib.crc32(f"airflow_transactional:{schema}".encode()) & 0x7FFFFFFF


def current_version(db: Database, schema: str = DEFAULT_SCHEMA) -> int:
    """The highest applied migration, 0 for an empty database."""
    with db.transaction() as cur:
        if not catalog.exists(cur, table(schema, "schema_migrations")):
            return 0
        cur.execute(sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_migrations").format(
            sql.Identifier(schema)))
        return int(cur.fetchone()[0])


def migrate(db: Database, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Bring the schema to the latest version; return the versions applied now (often none)."""
    identifiers.name("schema name", schema)
    s = sql.Identifier(schema)
    applied: list[int] = []
    if current_version(db, schema) >= MIGRATIONS[-1][0]:
        return applied  # up to date: no DDL, so a run-time role without CREATE rights gets here
    with db.transaction() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(schema),))
        if not catalog.schema_exists(cur, schema):  # owning the schema is enough; creating it needs CREATE
            cur.execute(sql.SQL("CREATE SCHEMA {}").format(s))
        cur.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())").format(s))
        cur.execute(sql.SQL("SELECT version FROM {}.schema_migrations").format(s))
        done = {row[0] for row in cur.fetchall()}
        for version, name, statements in MIGRATIONS:
            if version in done:
                continue
            cur.execute(sql.SQL(statements).format(s=s))
            cur.execute(sql.SQL("INSERT INTO {}.schema_migrations (version, name) VALUES (%s, %s)")
                        .format(s), (version, name))
            applied.append(version)
            log.info("applied migration %d (%s) to schema %s", version, name, schema)
    return applied
