-- What the Transactions pages of the Airflow UI read: recent transactions with their attempts and
-- commits, the commit rate, and the quarantine of one txid.

-- name: view_transactions
-- The latest transactions with their commits and their checks, latest first (one run, or every run).
SELECT t.txid, t.run_key, t.status, t.planned_at, t.planned_records, t.start_offsets, t.end_offsets, t.batch,
       t.failure, t.failed_tries, t.last_try_failure, t.committed_at, c.commit_started_at, c.attempt AS committed_attempt, c.records_read,
       c.row_counts, c.quarantined, t.corrects, c.code, c.digests, v.status AS check_status, v.detail AS check_detail
FROM {s}.transactions t LEFT JOIN {s}.commits c ON c.topology_id = t.topology_id AND c.txid = t.txid
LEFT JOIN {s}.verifications v ON v.topology_id = t.topology_id AND v.txid = t.txid
WHERE t.topology_id = %(topology)s AND t.run_key = coalesce(%(run_key)s, t.run_key)
ORDER BY t.txid DESC LIMIT %(limit)s

-- name: view_attempts
SELECT txid, attempt, plan_version, status, started_at, finished_at, records_read, row_counts, quarantined,
       worker, error
FROM {s}.attempts WHERE topology_id = %(topology)s AND txid = ANY(%(txids)s) ORDER BY txid, attempt

-- name: view_commit_rate
-- Commits of the last minutes, and how many minutes of those the topology has been committing (a
-- topology younger than the window: since its first commit, which the primary key finds).
SELECT (SELECT count(*) FROM {s}.commits WHERE topology_id = %(topology)s
        AND committed_at > clock_timestamp() - make_interval(mins => %(minutes)s)) AS commits,
       least(%(minutes)s, extract(epoch FROM clock_timestamp() - (
           SELECT committed_at FROM {s}.commits WHERE topology_id = %(topology)s ORDER BY txid LIMIT 1)) / 60)
           AS minutes

-- name: view_quarantined
-- Bad records of one txid (optionally of one kind of reason: {kind}), the latest attempt's first, in
-- source order.
SELECT id, txid, attempt, source_offset, event_id, reason, record, committed FROM {s}.quarantine
WHERE topology_id = %(topology)s AND txid = %(txid)s AND (%(reason)s::text IS NULL OR {kind} = %(reason)s)
ORDER BY attempt DESC, id LIMIT %(limit)s OFFSET %(offset)s

-- name: view_quarantine_reasons
-- A txid's bad records by the kind of their reason ({kind}: not one entry per value refused).
SELECT {kind} AS reason, count(*) AS records FROM {s}.quarantine WHERE topology_id = %(topology)s AND txid = %(txid)s
GROUP BY 1 ORDER BY count(*) DESC, 1

-- name: view_appended
-- How many events each txid's commit appended to each output (an output's LSNs in a partition are
-- consecutive under its lock).
SELECT txid, output, sum(last_lsn - first_lsn + 1)::bigint AS events FROM {s}.output_ranges
WHERE topology_id = %(topology)s AND txid = ANY(%(txids)s) GROUP BY txid, output

-- name: view_verdict_counts
-- How many requests each txid's commit granted and declined, per decision.
SELECT txid, decision, count(*) FILTER (WHERE granted) AS granted, count(*) FILTER (WHERE NOT granted) AS declined
FROM {s}.verdicts WHERE topology_id = %(topology)s AND txid = ANY(%(txids)s) GROUP BY txid, decision
