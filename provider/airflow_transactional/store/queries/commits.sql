-- The commits table (the audit log: one row per committed txid, in order) and the quarantine (bad
-- records of attempts, kept with the attempt that found them).

-- name: commit_record
INSERT INTO {s}.commits (topology_id, txid, attempt, plan_version, run_key, start_offsets, end_offsets,
                         records_read, row_counts, quarantined, committer, commit_started_at, committed_at, code,
                         digests, corrects)
VALUES (%(topology)s, %(txid)s, %(attempt)s, %(plan_version)s, %(run_key)s, %(start_offsets)s, %(end_offsets)s,
        %(records_read)s, %(row_counts)s, %(quarantined)s, %(committer)s, %(commit_started_at)s, %(committed_at)s,
        %(code)s, %(digests)s, %(corrects)s)

-- name: commit_get
SELECT committed_at, attempt FROM {s}.commits WHERE topology_id = %(topology)s AND txid = %(txid)s

-- name: commit_log
-- The audit log of a topology in txid order (one txid's entry when txid is not null), after txid %(after)s.
SELECT {columns} FROM {s}.commits WHERE topology_id = %(topology)s AND txid = coalesce(%(txid)s, txid)
    AND txid > %(after)s ORDER BY txid

-- name: commit_end_offsets
SELECT end_offsets FROM {s}.commits WHERE topology_id = %(topology)s AND txid = %(txid)s

-- name: commit_journal
-- The txids committed after a txid and their attempts (0: an empty batch), in order.
SELECT txid, attempt FROM {s}.commits WHERE topology_id = %(topology)s AND txid > %(txid)s ORDER BY txid

-- name: quarantine_insert
INSERT INTO {s}.quarantine (topology_id, txid, attempt, source_offset, event_id, reason, record, record_length)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)

-- name: quarantine_copy
-- How a Spark job streams its bad records in (CSV, from the executors), each row naming the COPY
-- slice and the Spark task that wrote it (the table's slice and writer columns).
COPY {s}.quarantine (topology_id, txid, attempt, slice, writer, source_offset, event_id, reason, record,
                     record_length)
FROM STDIN WITH (FORMAT csv)

-- name: quarantine_settle
-- At the commit: the committed attempt's bad records are kept (marked committed), the others' go.
DELETE FROM {s}.quarantine WHERE topology_id = %(topology)s AND txid = %(txid)s AND attempt IS DISTINCT FROM %(attempt)s;
-- Of a slice two Spark tasks copied (one run again after its COPY), the first task's rows.
DELETE FROM {s}.quarantine q WHERE q.topology_id = %(topology)s AND q.txid = %(txid)s AND q.writer IS NOT NULL
    AND q.writer > (SELECT min(o.writer) FROM {s}.quarantine o WHERE o.topology_id = q.topology_id
                    AND o.txid = q.txid AND o.attempt = q.attempt AND o.slice = q.slice);
UPDATE {s}.quarantine SET committed = true WHERE topology_id = %(topology)s AND txid = %(txid)s

-- name: recent_quarantine
-- What the latest %(txids)s committed txids (no correction) read and set aside, summed.
SELECT coalesce(sum(records_read), 0) AS records, coalesce(sum(quarantined), 0) AS quarantined
FROM (SELECT records_read, quarantined FROM {s}.commits WHERE topology_id = %(topology)s AND corrects IS NULL
      ORDER BY txid DESC LIMIT %(txids)s) latest;

-- name: quarantine_counts
-- Records set aside: committed ones a correction or a replay has not taken (counted, or quarantined
-- again by the replay), and pending ones of attempts not committed yet.
SELECT count(*) FILTER (WHERE committed AND corrected_by IS NULL AND replayed_by IS NULL) AS committed,
       count(*) FILTER (WHERE NOT committed) AS pending
FROM {s}.quarantine WHERE topology_id = %(topology)s

-- name: quarantine_reason_kind
-- A fragment: a quarantined record's reason without the value it refused -- what records set aside
-- for the same cause share (airflow_transactional.quarantine.template, the same two rules).
regexp_replace(regexp_replace(reason, '(, got |: got ).*$', '\1…'), '^([^:]+: [^''"]*): [''"].*$', '\1: …')

-- name: quarantine_top_reasons
-- An attempt's bad records by the kind of their reason, the most common first.
SELECT {kind} AS why, count(*) AS n
FROM {s}.quarantine WHERE topology_id = %(topology)s AND txid = %(txid)s AND attempt = %(attempt)s
GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT %(limit)s

-- name: quarantine_delete_orphans
-- Uncommitted bad records of attempts that are neither running nor complete.
DELETE FROM {s}.quarantine q WHERE q.topology_id = %(topology)s AND NOT q.committed AND NOT EXISTS (
    SELECT 1 FROM {s}.attempts x WHERE x.topology_id = q.topology_id AND x.txid = q.txid
    AND x.attempt = q.attempt AND x.status IN ('running', 'complete'))

-- name: quarantine_delete
DELETE FROM {s}.quarantine WHERE topology_id = %(topology)s
