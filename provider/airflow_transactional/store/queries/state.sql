-- A topology's state tables and what the commit does to them. Every statement here is composed
-- for one state of one topology: {target} or {table} is a table, {keys} its key columns (quoted,
-- comma-separated), {key_defs} them with their types, {value_type} the value's type, {delta} a
-- SELECT of (keys, value). Parameter txid: the batch being committed.

-- name: state_create_schema
CREATE SCHEMA IF NOT EXISTS {schema}

-- name: state_create
-- {prev}: "prev_value <type>, " for an opaque value (the value before this txid, to recompute from).
CREATE TABLE IF NOT EXISTS {table} ({key_defs}, value {value_type}, {prev}txid bigint NOT NULL,
                                    PRIMARY KEY ({keys}))

-- name: state_staging_create
-- Staged partials of one state, keyed by (txid, attempt, key).
CREATE TABLE IF NOT EXISTS {table} (txid bigint NOT NULL, attempt integer NOT NULL, {key_defs},
                                    value {value_type}, PRIMARY KEY (txid, attempt, {keys}))

-- name: state_history_view
-- A state's delta history as a view, made with its staging table at registration.
CREATE OR REPLACE VIEW {view} AS SELECT s.txid, {keys}, s.value AS delta FROM {table} s
JOIN {s}.commits c ON c.topology_id = {topology} AND c.txid = s.txid AND c.attempt = s.attempt

-- name: drop_view_if_exists
DROP VIEW IF EXISTS {view}

-- name: state_delta_create
-- One attempt's delta, dropped at commit.
CREATE TEMP TABLE {table} ({key_defs}, value {value_type}) ON COMMIT DROP

-- name: state_staged_count
SELECT count(*) FROM {table} WHERE txid = %s AND attempt = %s

-- name: state_staged_delete
DELETE FROM {table} WHERE txid = %s

-- name: state_staged_delta
SELECT {keys}, value FROM {table} WHERE txid = %(txid)s AND attempt = %(attempt)s

-- name: state_upsert_transactional
-- Transactional: a key whose stored txid is already this batch's is skipped (t.txid < EXCLUDED.txid),
-- so a replay never counts twice. A row with a later txid is not touched (state_rows_ahead finds it).
INSERT INTO {target} AS t ({keys}, value, txid)
SELECT {keys}, value, %(txid)s FROM ({delta}) d
ON CONFLICT ({keys}) DO UPDATE SET value = {combined}, txid = EXCLUDED.txid
WHERE t.txid < EXCLUDED.txid

-- name: state_upsert_opaque
-- Opaque: recompute from prev_value when the stored txid is this batch's (a replay with another
-- batch), else shift value into prev_value.
INSERT INTO {target} AS t ({keys}, value, prev_value, txid)
SELECT {keys}, value, NULL, %(txid)s FROM ({delta}) d
ON CONFLICT ({keys}) DO UPDATE SET
    value = CASE WHEN t.txid = EXCLUDED.txid THEN {from_prev} ELSE {from_value} END,
    prev_value = CASE WHEN t.txid = EXCLUDED.txid THEN t.prev_value ELSE t.value END,
    txid = EXCLUDED.txid
WHERE t.txid <= EXCLUDED.txid

-- name: state_find_overflows
-- The delta rows whose sum with the value they fold into ({base}: the value rule's) leaves low ..
-- high, kept in txn_overflow (set aside by state_without_overflows) and listed (key as JSON).
CREATE TEMP TABLE txn_overflow ON COMMIT DROP AS
SELECT {d_keys}, {base} AS committed, d.value AS added
FROM ({delta}) d JOIN {target} t ON {t_is_d}
WHERE t.txid <= %(txid)s AND NOT coalesce({base}, 0)::numeric + d.value::numeric BETWEEN %(low)s AND %(high)s;
SELECT jsonb_build_array({keys}), committed, added FROM txn_overflow

-- name: state_without_overflows
SELECT * FROM ({delta}) d WHERE NOT EXISTS (SELECT 1 FROM txn_overflow o WHERE {o_is_d})

-- name: state_rows_ahead
-- Delta keys whose stored value already carries a later txid: the commit refuses.
SELECT count(*) FROM ({delta}) d JOIN {target} t ON {t_is_d} WHERE t.txid > %(txid)s

-- name: state_audit_create
-- Where an audit (or a rebuild) loads the state it recomputed from the source.
DROP TABLE IF EXISTS {table};
CREATE UNLOGGED TABLE {table} ({key_defs}, value {value_type}, PRIMARY KEY ({keys}))

-- name: state_audit_diff
-- Keys whose stored value differs from the recomputed one: (key as text, stored, recomputed). For
-- a count or a sum, a key at 0 and a key never seen are the same value ({zero}: 0, else NULL).
SELECT {key_text}, s.value::text, a.value::text FROM {recomputed} a FULL JOIN {target} s ON {a_is_s}
WHERE coalesce(a.value, {zero}) IS DISTINCT FROM coalesce(s.value, {zero}) ORDER BY 1

-- name: state_fold_recomputed
-- A recomputation's second part (what committed replays counted) folded into its first.
INSERT INTO {target} AS t ({keys}, value) SELECT {keys}, value FROM {extra}
ON CONFLICT ({keys}) DO UPDATE SET value = {combined}

-- name: state_shadow_create
-- A rebuild's copy of the state table, filled with the recomputed values as of txid.
CREATE TEMP TABLE {shadow} (LIKE {target} INCLUDING ALL) ON COMMIT DROP

-- name: state_shadow_fill
INSERT INTO {shadow} ({keys}, value, {prev}txid) SELECT {keys}, value, {null}%(txid)s FROM {recomputed}

-- name: state_replace_delete
-- A rebuild's swap, in place (grants and views stay valid) with plain DML, so a reader whose
-- snapshot predates it still sees the old rows (TRUNCATE would show it an empty table): delete the
-- keys the shadow lacks, write those that differ.
DELETE FROM {target} t WHERE NOT EXISTS (SELECT 1 FROM {shadow} s WHERE {s_is_t})

-- name: state_replace_write
INSERT INTO {target} AS t ({columns}) SELECT {columns} FROM {shadow}
ON CONFLICT ({keys}) DO UPDATE SET {new} WHERE ({old}) IS DISTINCT FROM ({excluded})

-- name: copy_into
COPY {table} ({columns}) FROM STDIN

-- name: copy_into_csv
COPY {table} ({columns}) FROM STDIN WITH (FORMAT csv)
