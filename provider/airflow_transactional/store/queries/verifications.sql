-- name: verify_mark
SELECT verified_through, committed_txid FROM {s}.topologies WHERE topology_id = %(topology)s

-- name: verify_candidates
-- Committed txids after the mark not checked yet (or waiting for their code or a correction), in
-- order: what committed each, and how.
SELECT c.txid, c.attempt, c.code, c.digests, c.records_read, c.quarantined, t.corrects, t.batch,
       t.planned_records, t.read_digest,
       (SELECT count(*) FROM {s}.attempts a WHERE a.topology_id = c.topology_id AND a.txid = c.txid) AS attempts
FROM {s}.commits c JOIN {s}.transactions t USING (topology_id, txid)
WHERE c.topology_id = %(topology)s AND c.txid > %(after)s
  AND NOT EXISTS (SELECT 1 FROM {s}.verifications v WHERE v.topology_id = c.topology_id AND v.txid = c.txid
                  AND NOT (v.status = 'unverifiable' AND v.detail ? 'waiting'))
ORDER BY c.txid LIMIT %(limit)s

-- name: verify_candidate
-- One committed txid, with what committed it (whether checked or not).
SELECT c.txid, c.attempt, c.code, c.digests, c.records_read, c.quarantined, t.corrects, t.batch,
       t.planned_records, t.read_digest, 0::bigint AS attempts
FROM {s}.commits c JOIN {s}.transactions t USING (topology_id, txid)
WHERE c.topology_id = %(topology)s AND c.txid = %(txid)s

-- name: verify_record
INSERT INTO {s}.verifications (topology_id, txid, status, detail)
VALUES (%(topology)s, %(txid)s, %(status)s, %(detail)s)
ON CONFLICT (topology_id, txid) DO UPDATE SET status = EXCLUDED.status, detail = EXCLUDED.detail,
    checked_at = now()

-- name: verify_forget
-- Checks to run again: their rows go (the mark steps back before the first of them).
WITH gone AS (DELETE FROM {s}.verifications WHERE topology_id = %(topology)s AND txid BETWEEN %(first)s AND %(last)s
              RETURNING txid)
UPDATE {s}.topologies SET verified_through = least(verified_through, %(first)s - 1)
WHERE topology_id = %(topology)s RETURNING verified_through

-- name: verify_advance
-- The mark moves over the contiguous run of passing txids after it: verified, skipped, or superseded
-- by a correction that is verified itself.
WITH passing AS (
    SELECT v.txid, row_number() OVER (ORDER BY v.txid) AS n FROM {s}.verifications v
    WHERE v.topology_id = %(topology)s AND v.txid > %(mark)s
      AND (v.status IN ('verified', 'skipped')
           OR (v.status = 'superseded' AND EXISTS (
                SELECT 1 FROM {s}.verifications w WHERE w.topology_id = v.topology_id
                    AND w.txid = (v.detail ->> 'by')::bigint AND w.status = 'verified'))))
UPDATE {s}.topologies SET verified_through = greatest(verified_through,
    coalesce((SELECT max(txid) FROM passing WHERE txid = %(mark)s + n), 0))
WHERE topology_id = %(topology)s RETURNING verified_through

-- name: verify_statuses
-- The checks of txids first..last (a committed txid without one is pending).
SELECT c.txid, v.status, v.detail, v.checked_at FROM {s}.commits c
LEFT JOIN {s}.verifications v USING (topology_id, txid)
WHERE c.topology_id = %(topology)s AND c.txid BETWEEN %(first)s AND %(last)s ORDER BY c.txid

-- name: verify_failures
SELECT txid, status, detail, checked_at FROM {s}.verifications
WHERE topology_id = %(topology)s AND status = 'failed' ORDER BY txid LIMIT %(limit)s

-- name: verify_any
SELECT EXISTS (SELECT 1 FROM {s}.verifications WHERE topology_id = %(topology)s)

-- name: verify_counts
SELECT coalesce(v.status, 'pending') AS status, count(*) AS n FROM {s}.commits c
LEFT JOIN {s}.verifications v USING (topology_id, txid)
WHERE c.topology_id = %(topology)s AND c.txid > 0 GROUP BY 1

-- name: verify_covering
-- The range corrections committed after a txid whose range holds it (the first of them).
SELECT min(t.txid) FROM {s}.transactions t JOIN {s}.commits c USING (topology_id, txid)
WHERE t.topology_id = %(topology)s AND t.txid > %(txid)s AND t.corrects ? 'txids'
  AND (t.corrects -> 'txids' ->> 0)::bigint <= %(txid)s AND (t.corrects -> 'txids' ->> 1)::bigint >= %(txid)s

-- name: verify_clear
-- A recomputation's rows (its txid, attempt -1), before loading it and after judging it.
DELETE FROM {table} WHERE txid = %(txid)s AND attempt = %(attempt)s

-- name: verify_diff
-- Keys whose recomputed delta (attempt -1, in the round's own table) differs from the committed one:
-- (key as text, committed, recomputed), up to %(samples)s.
WITH r AS (SELECT {keys}, value FROM {recomputed} WHERE txid = %(txid)s AND attempt = %(attempt)s),
     k AS (SELECT {keys}, value FROM {table} WHERE txid = %(txid)s AND attempt = %(committed)s)
SELECT concat_ws(',', {keys}), k.value::text, r.value::text FROM r FULL JOIN k USING ({keys})
WHERE r.value IS DISTINCT FROM k.value ORDER BY 1 LIMIT %(samples)s

-- name: verify_drift
-- Keys whose stored value is not what the delta history through the committed txid folds to (a
-- state written outside the commits): (key as text, stored, from the history, the last txid that
-- changed it), up to %(samples)s; one statement, one snapshot of the state and its history.
WITH h AS (SELECT {keys}, {fold} AS value, max(s.txid) AS last_txid FROM {table} s
           JOIN {s}.commits c ON c.topology_id = %(topology)s AND c.txid = s.txid AND c.attempt = s.attempt
           WHERE s.txid BETWEEN %(from_txid)s AND (SELECT committed_txid FROM {s}.topologies
                                                   WHERE topology_id = %(topology)s)
           GROUP BY {keys})
SELECT {key_text}, t.value::text, h.value::text, h.last_txid FROM h FULL JOIN {target} t ON {h_is_t}
WHERE h.value IS DISTINCT FROM t.value ORDER BY 1 LIMIT %(samples)s

-- name: verify_quarantined_through
-- The records txids through one set aside that no replay or correction took since.
SELECT count(*) FROM {s}.quarantine WHERE topology_id = %(topology)s AND committed AND txid <= %(txid)s
    AND corrected_by IS NULL AND replayed_by IS NULL

-- name: verify_audit_base
-- An audit's recomputation of the txids after a verified mark, plus each key's sum through the mark
-- from the delta history (states of sums and counts).
INSERT INTO {audit} AS a ({keys}, value)
SELECT {keys}, sum(s.value) FROM {table} s
JOIN {s}.commits c ON c.topology_id = %(topology)s AND c.txid = s.txid AND c.attempt = s.attempt
WHERE s.txid BETWEEN %(from_txid)s AND %(txid)s GROUP BY {keys}
ON CONFLICT ({keys}) DO UPDATE SET value = a.value + EXCLUDED.value

-- name: verify_rewritten
-- Each committed txid after the history's start, with the digest its commit recorded for a state
-- and the digest its kept rows have now (rows, hash): they differ when a history row was rewritten,
-- added or removed since -- by whoever may write the staging tables.
WITH d AS (SELECT txid, count(*) AS rows, sum(hashtextextended(ROW({keys}, value)::text, 0)::numeric) AS hash
           FROM {table} WHERE (txid, attempt) IN (SELECT txid, attempt FROM {s}.commits
                                                  WHERE topology_id = %(topology)s AND txid > %(from_txid)s)
           GROUP BY txid)
SELECT c.txid, c.digests ->> %(state)s, coalesce(d.rows, 0), coalesce(d.hash, 0)
FROM {s}.commits c LEFT JOIN d USING (txid)
WHERE c.topology_id = %(topology)s AND c.txid > %(from_txid)s AND c.digests ? %(state)s
ORDER BY c.txid
