-- The attempts table: every processing attempt of a transaction -- running, complete (with what it
-- staged), failed, discarded, or the one committed.

-- name: attempt_next_number
SELECT coalesce(max(attempt), 0) + 1 FROM {s}.attempts WHERE topology_id = %(topology)s AND txid = %(txid)s

-- name: attempt_insert
INSERT INTO {s}.attempts (topology_id, txid, attempt, plan_version, status, worker, code)
VALUES (%(topology)s, %(txid)s, %(attempt)s, %(plan_version)s, 'running', %(worker)s, %(code)s)

-- name: attempt_complete
-- Only a running attempt of the txid's current, uncommitted plan completes.
UPDATE {s}.attempts a SET status = 'complete', finished_at = clock_timestamp(), row_counts = %(row_counts)s,
       records_read = %(records_read)s, quarantined = %(quarantined)s, read_digest = %(read_digest)s
FROM {s}.transactions t
WHERE a.topology_id = %(topology)s AND a.txid = %(txid)s AND a.attempt = %(attempt)s AND a.status = 'running'
  AND t.topology_id = a.topology_id AND t.txid = a.txid AND t.plan_version = a.plan_version AND t.status = 'planned'

-- name: attempt_recount
-- A correction's attempt whose staged rows of some states became differences at the pin (states in
-- other databases): its counts of them are those of the differences, as the commit verifies.
UPDATE {s}.attempts SET row_counts = row_counts || %(row_counts)s
WHERE topology_id = %(topology)s AND txid = %(txid)s AND attempt = %(attempt)s

-- name: attempt_fail
UPDATE {s}.attempts SET status = 'failed', finished_at = clock_timestamp(), error = %(error)s
WHERE topology_id = %(topology)s AND txid = %(txid)s AND attempt = %(attempt)s AND status = 'running'

-- name: attempt_latest_finished
-- The latest complete attempt of the current plan of an uncommitted txid.
SELECT a.attempt, a.finished_at FROM {s}.attempts a JOIN {s}.transactions t USING (topology_id, txid)
WHERE a.topology_id = %(topology)s AND a.txid = %(txid)s AND a.status = 'complete'
  AND a.plan_version = t.plan_version AND t.status = 'planned'
ORDER BY a.attempt DESC LIMIT 1

-- name: attempt_outcome
SELECT attempt, row_counts, records_read, quarantined, code FROM {s}.attempts
WHERE topology_id = %(topology)s AND txid = %(txid)s AND attempt = %(attempt)s

-- name: attempt_latest_outcome
SELECT attempt, row_counts, records_read, quarantined, code FROM {s}.attempts
WHERE topology_id = %(topology)s AND txid = %(txid)s AND status = 'complete' AND plan_version = %(plan_version)s
ORDER BY attempt DESC LIMIT 1

-- name: attempt_settle
-- At the commit: the attempt committed, every other unfailed one discarded.
UPDATE {s}.attempts SET status = CASE WHEN attempt = %(committed)s THEN 'committed' ELSE 'discarded' END,
       finished_at = coalesce(finished_at, clock_timestamp())
WHERE topology_id = %(topology)s AND txid = %(txid)s AND status <> 'failed'

-- name: attempt_discard_replanned
UPDATE {s}.attempts SET status = 'discarded', finished_at = coalesce(finished_at, clock_timestamp()), error = %(error)s
WHERE topology_id = %(topology)s AND txid = %(txid)s AND status IN ('running', 'complete')

-- name: attempt_discard_superseded
-- Complete attempts that can never commit: of a committed txid (not the one committed), of an
-- older plan, or older than the latest complete attempt of the plan.
UPDATE {s}.attempts x SET status = 'discarded', finished_at = coalesce(x.finished_at, clock_timestamp()),
       error = coalesce(x.error, 'superseded or outdated')
FROM {s}.transactions t
WHERE x.topology_id = %(topology)s AND t.topology_id = x.topology_id AND t.txid = x.txid AND x.status = 'complete'
  AND x.attempt IS DISTINCT FROM t.pinned_attempt
  AND (t.status = 'committed' OR x.plan_version <> t.plan_version
       OR x.attempt < (SELECT max(y.attempt) FROM {s}.attempts y WHERE y.topology_id = x.topology_id
                       AND y.txid = x.txid AND y.status = 'complete' AND y.plan_version = t.plan_version))

-- name: attempt_delete_unusable_staged
-- Staged rows that can never be committed. Kept: rows of running attempts and of the latest
-- complete attempt of each uncommitted txid's current plan (and a pinned attempt), and the rows of
-- every committed (txid, attempt): the delta history (store/history.py), a rebuild's journal.
DELETE FROM {staging} s WHERE NOT EXISTS (
    SELECT 1 FROM {s}.attempts x JOIN {s}.transactions t USING (topology_id, txid)
    WHERE x.topology_id = %(topology)s AND x.txid = s.txid AND x.attempt = s.attempt
      AND t.status = 'planned' AND (x.attempt = t.pinned_attempt
                                    OR (x.plan_version = t.plan_version AND x.status IN ('running', 'complete'))))
  AND NOT EXISTS (SELECT 1 FROM {s}.commits c WHERE c.topology_id = %(topology)s AND c.txid = s.txid
                  AND c.attempt = s.attempt)

-- name: attempt_digest_differs
-- The committed attempt read other records than its plan's first complete attempt (none: NULL).
SELECT a.read_digest AS attempt_digest, t.read_digest AS plan_digest FROM {s}.attempts a
JOIN {s}.transactions t USING (topology_id, txid)
WHERE a.topology_id = %(topology)s AND a.txid = %(txid)s AND a.attempt = %(attempt)s
  AND a.read_digest IS DISTINCT FROM t.read_digest AND a.read_digest IS NOT NULL AND t.read_digest IS NOT NULL
