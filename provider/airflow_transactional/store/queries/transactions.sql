-- The transactions table: one row per planned transaction (one DAG run) -- its txid, its run, its
-- batch as exact source offsets, its plan's version, and whether it failed for good.

-- name: transaction_get
SELECT {columns} FROM {s}.transactions WHERE topology_id = %(topology)s AND txid = %(txid)s {lock}

-- name: transaction_uncommitted_from
-- Every transaction from a txid on, lowest first, row locked (a re-plan).
SELECT {columns} FROM {s}.transactions WHERE topology_id = %(topology)s AND txid >= %(txid)s ORDER BY txid FOR UPDATE

-- name: transaction_of_run
SELECT txid FROM {s}.transactions WHERE topology_id = %(topology)s AND run_key = %(run_key)s

-- name: transaction_planned
SELECT txid, run_key FROM {s}.transactions WHERE topology_id = %(topology)s AND status = 'planned' ORDER BY txid

-- name: transaction_last
SELECT txid, end_offsets FROM {s}.transactions WHERE topology_id = %(topology)s ORDER BY txid DESC LIMIT 1

-- name: transaction_insert
INSERT INTO {s}.transactions (topology_id, txid, run_key, start_offsets, end_offsets, batch, planned_records,
                              corrects)
VALUES (%(topology)s, %(txid)s, %(run_key)s, %(start)s, %(end)s, %(batch)s, %(planned_records)s, %(corrects)s)

-- name: transaction_replace_plan
-- A new version of the plan: the earlier attempts can no longer be committed.
UPDATE {s}.transactions SET plan_version = plan_version + 1, start_offsets = %(start)s, end_offsets = %(end)s,
       batch = %(batch)s, planned_records = %(planned_records)s, replanned_at = clock_timestamp(),
       replan_reason = %(reason)s, read_digest = NULL
WHERE topology_id = %(topology)s AND txid = %(txid)s

-- name: transaction_hand_over
UPDATE {s}.transactions SET run_key = %(new_run_key)s, failed_at = NULL, failure = NULL
WHERE topology_id = %(topology)s AND txid = %(txid)s AND run_key = %(old_run_key)s AND status = 'planned'

-- name: transaction_lift_failed
UPDATE {s}.transactions SET failed_at = NULL, failure = NULL
WHERE topology_id = %(topology)s AND txid = %(txid)s AND failed_at IS NOT NULL

-- name: transaction_mark_failed
UPDATE {s}.transactions SET failed_at = clock_timestamp(), failure = %(reason)s
WHERE topology_id = %(topology)s AND txid = %(txid)s AND status = 'planned'

-- name: transaction_note_failed_try
-- A try of the txid's processing failed (retried or not): counted, with its reason in one line.
UPDATE {s}.transactions SET failed_tries = failed_tries + 1, last_try_failure = %(reason)s,
       last_try_failed_at = clock_timestamp()
WHERE topology_id = %(topology)s AND txid = %(txid)s AND status = 'planned'

-- name: transaction_first_failed_before
-- The lowest uncommitted txid below a txid that failed for good, with the error its latest attempt
-- recorded (if that one failed with one).
SELECT t.txid, t.run_key, t.failure, a.attempt, a.error AS attempt_error FROM {s}.transactions t
LEFT JOIN LATERAL (SELECT x.attempt, x.error FROM {s}.attempts x WHERE x.topology_id = t.topology_id
                   AND x.txid = t.txid ORDER BY x.attempt DESC LIMIT 1) a ON a.error IS NOT NULL
WHERE t.topology_id = %(topology)s AND t.txid < %(txid)s AND t.status = 'planned' AND t.failed_at IS NOT NULL
ORDER BY t.txid LIMIT 1

-- name: transaction_last_attempt_error
SELECT attempt, error FROM {s}.attempts WHERE topology_id = %(topology)s AND txid = %(txid)s
ORDER BY attempt DESC LIMIT 1

-- name: transaction_last_try_failure
SELECT last_try_failure FROM {s}.transactions
WHERE topology_id = %(topology)s AND txid = %(txid)s AND last_try_failure IS NOT NULL

-- name: transaction_in_flight
-- Every planned txid, lowest first, with how many attempts it had and the latest of its current plan.
-- A failed try of the process task later than the latest attempt began is what happened last (its
-- driver died before registering one, or the task failed around it). `since`: when what it is doing
-- now began (planned or re-planned, its latest attempt started or ended, its last try failed).
SELECT t.txid, t.run_key, t.plan_version,
       (SELECT count(*) FROM {s}.attempts x WHERE x.topology_id = t.topology_id AND x.txid = t.txid) AS attempts,
       l.status AS latest_status, l.error AS latest_error, t.failed_tries,
       CASE WHEN t.last_try_failed_at > coalesce(l.started_at, '-infinity') THEN t.last_try_failure END
           AS try_failure,
       CASE WHEN t.last_try_failed_at > coalesce(l.started_at, '-infinity') THEN t.last_try_failed_at
            ELSE coalesce(l.finished_at, l.started_at, t.replanned_at, t.planned_at) END AS since
FROM {s}.transactions t LEFT JOIN LATERAL (
    SELECT x.status, x.error, x.started_at, x.finished_at FROM {s}.attempts x WHERE x.topology_id = t.topology_id
    AND x.txid = t.txid AND x.plan_version = t.plan_version ORDER BY x.attempt DESC LIMIT 1) l ON true
WHERE t.topology_id = %(topology)s AND t.status = 'planned' ORDER BY t.txid

-- name: transaction_mark_committed
UPDATE {s}.transactions SET status = 'committed', committed_at = %(at)s
WHERE topology_id = %(topology)s AND txid = %(txid)s

-- name: transaction_pin
-- Fix the attempt a commit applies (no re-plan or newer attempt can change it any more).
UPDATE {s}.transactions SET pinned_attempt = %(attempt)s WHERE topology_id = %(topology)s AND txid = %(txid)s

-- name: transaction_lost_ranges
-- The source ranges retention removed from the batches committed through a txid.
SELECT batch->'lost'->'ranges' FROM {s}.transactions
WHERE topology_id = %(topology)s AND txid <= %(txid)s AND status = 'committed' AND batch ? 'lost'

-- name: transaction_planned_through
-- The highest file sequence number a plan of a landing topology took.
SELECT coalesce(max((end_offsets->>'seq')::bigint), 0) FROM {s}.transactions WHERE topology_id = %(topology)s

-- name: transaction_last_batch
-- The batch of the latest plan: what a source compares the source it reads now with.
SELECT batch FROM {s}.transactions WHERE topology_id = %(topology)s ORDER BY txid DESC LIMIT 1

-- name: transaction_range_origins
-- Where a topology began reading each partition of its source: the lowest offset any stored plan's
-- batch ranges ([partition, from, to]) start at.
SELECT r ->> 0 AS partition, min((r ->> 1)::bigint) AS origin
FROM {s}.transactions t, jsonb_array_elements(coalesce(t.batch -> 'ranges', '[]'::jsonb)) r
WHERE t.topology_id = %(topology)s GROUP BY r ->> 0

-- name: transaction_fix_digest
-- The first complete attempt of a plan fixes what the plan reads; later ones are compared with it.
UPDATE {s}.transactions SET read_digest = coalesce(read_digest, %(digest)s)
WHERE topology_id = %(topology)s AND txid = %(txid)s AND plan_version = %(plan_version)s
RETURNING read_digest

-- name: transaction_take_digest
-- An opaque topology takes what its source holds now: the plan's digest becomes the new one.
UPDATE {s}.transactions SET read_digest = %(digest)s
WHERE topology_id = %(topology)s AND txid = %(txid)s AND plan_version = %(plan_version)s
