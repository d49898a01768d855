-- The delta history (store/history.py): the staged rows a commit applied, kept in the state's
-- staging table {table}; the rows of a (txid, attempt) the commits table names are the history.
-- {keys}: the state's key columns, {s}: the provider's schema.

-- name: history_keep
-- At the commit: the committed attempt's rows stay as the txid's deltas; other attempts' rows go.
DELETE FROM {table} WHERE txid = %(txid)s AND attempt IS DISTINCT FROM %(attempt)s

-- name: history_drop_set_aside
-- The keys the commit set aside (txn_overflow, quarantined) are not part of what it applied.
DELETE FROM {table} s USING txn_overflow o WHERE s.txid = %(txid)s AND s.attempt = %(attempt)s AND {o_is_s}

-- name: history_digest
-- How many rows one (txid, attempt) applied and the sum of their hashes: the same whatever their order.
SELECT count(*) AS rows, coalesce(sum(hashtextextended(ROW({keys}, value)::text, 0)::numeric), 0) AS hash
FROM {table} WHERE txid = %(txid)s AND attempt = %(attempt)s

-- name: history_deltas
-- The deltas one committed txid applied to a state (the rows of its committed attempt).
SELECT {keys}, value FROM {table} s JOIN {s}.commits c ON c.topology_id = %(topology)s AND c.txid = s.txid
    AND c.attempt = s.attempt
WHERE s.txid = %(txid)s ORDER BY {keys}

-- name: history_as_of
-- A state as of a committed txid: its deltas through that txid folded per key ({fold}), from the
-- snapshot at history_from_txid on. Keys whose folded value is null (none) are left out.
SELECT {keys}, {fold} AS value FROM {table} s JOIN {s}.commits c ON c.topology_id = %(topology)s
    AND c.txid = s.txid AND c.attempt = s.attempt
WHERE s.txid BETWEEN %(from_txid)s AND %(txid)s GROUP BY {keys} ORDER BY {keys}

-- name: history_fold_into
-- A snapshot as of %(txid)s (written as that txid's rows, attempt %(attempt)s): the history from
-- %(from_txid)s folded per key; then the folded rows go.
CREATE TEMP TABLE txn_snapshot ON COMMIT DROP AS
SELECT {keys}, {fold} AS value FROM {table} s JOIN {s}.commits c ON c.topology_id = %(topology)s
    AND c.txid = s.txid AND c.attempt = s.attempt
WHERE s.txid BETWEEN %(from_txid)s AND %(txid)s GROUP BY {keys};
DELETE FROM {table} s USING {s}.commits c WHERE c.topology_id = %(topology)s AND c.txid = s.txid
    AND c.attempt = s.attempt AND s.txid <= %(txid)s;
INSERT INTO {table} (txid, attempt, {keys}, value)
SELECT %(txid)s, %(attempt)s, {keys}, value FROM txn_snapshot WHERE value IS NOT NULL;
DROP TABLE txn_snapshot

-- name: history_snapshot_of
-- A snapshot as of %(txid)s taken from {source} (keys, value): the state table at its committed
-- txid, or a rebuild's recomputation; the history through that txid goes.
DELETE FROM {table} s USING {s}.commits c WHERE c.topology_id = %(topology)s AND c.txid = s.txid
    AND c.attempt = s.attempt AND s.txid <= %(txid)s;
INSERT INTO {table} (txid, attempt, {keys}, value) SELECT %(txid)s, %(attempt)s, {keys}, value FROM {source}
WHERE value IS NOT NULL

-- name: history_mark
SELECT history_from_txid, history_base FROM {s}.topologies WHERE topology_id = %(topology)s

-- name: history_set_mark
UPDATE {s}.topologies SET history_from_txid = %(from_txid)s, history_base = %(base)s
WHERE topology_id = %(topology)s

-- name: history_size
-- How many deltas a state's history holds and how many bytes its staging table takes.
SELECT count(*) AS deltas, pg_total_relation_size(%(table)s::regclass) AS bytes FROM {table} s
JOIN {s}.commits c ON c.topology_id = %(topology)s AND c.txid = s.txid AND c.attempt = s.attempt
