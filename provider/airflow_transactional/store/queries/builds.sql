-- name: build_chunks_create
-- A state build's fold of the history, chunk by chunk of txids (the committed replays' records a
-- chunk of their own, txids 0..0): planned once, each marked done in the transaction that folds it
-- into the build's load tables -- what a build taken up again skips, and what its progress says.
CREATE TABLE IF NOT EXISTS {table} (first_txid bigint NOT NULL, last_txid bigint PRIMARY KEY,
    records bigint NOT NULL, started_at timestamptz, done_at timestamptz)

-- name: build_chunks_add
INSERT INTO {table} (first_txid, last_txid, records) VALUES (%(first)s, %(last)s, %(records)s)

-- name: build_chunks_read
SELECT first_txid, last_txid, records, started_at, done_at FROM {table} ORDER BY last_txid

-- name: build_chunk_started
UPDATE {table} SET started_at = now() WHERE last_txid = %(last)s

-- name: build_chunk_done
UPDATE {table} SET done_at = now() WHERE last_txid = %(last)s AND done_at IS NULL

-- name: build_planned_records
-- The records each committed txid through M planned (a correction's and a replay's: none of the source's).
SELECT txid, CASE WHEN corrects IS NULL THEN planned_records ELSE 0 END FROM {s}.transactions
WHERE topology_id = %(topology)s AND txid BETWEEN 1 AND %(through)s AND status = 'committed' ORDER BY txid
