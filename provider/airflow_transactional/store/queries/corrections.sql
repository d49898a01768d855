-- Corrections (core/corrections.py): committed txids re-processed, their difference committed as a
-- txid of its own. {table}: a state's staging table (its delta history), {keys} its key columns.

-- name: correction_committed_txns
-- The committed transactions first..last, in order.
SELECT {columns} FROM {s}.transactions WHERE topology_id = %(topology)s AND txid BETWEEN %(first)s AND %(last)s
    AND status = 'committed' ORDER BY txid

-- name: committed_replay_ids
-- The quarantined records the replays committed as txids first..last took (each once).
SELECT DISTINCT r.id::bigint FROM {s}.transactions t, jsonb_array_elements_text(t.batch -> 'replay') AS r(id)
WHERE t.topology_id = %(topology)s AND t.txid BETWEEN %(first)s AND %(last)s AND t.status = 'committed'
    AND t.batch ? 'replay'
ORDER BY 1

-- name: correction_ranges
-- Every correction and replay planned (through a txid, when given), what it corrects, and how many
-- of the records it replays were edited by hand.
SELECT t.txid, t.corrects, (SELECT count(*) FROM {s}.quarantine q WHERE q.topology_id = t.topology_id
                            AND q.replayed_by = t.txid AND q.edited_record IS NOT NULL) AS edited
FROM {s}.transactions t WHERE t.topology_id = %(topology)s AND t.corrects IS NOT NULL
    AND t.txid <= coalesce(%(through)s, t.txid) ORDER BY t.txid

-- name: correction_differences
-- The attempt's staged rows (the new values of the corrected range) become, per key, the new
-- value less what the old txids applied; keys where they are equal go.
CREATE TEMP TABLE txn_new ON COMMIT DROP AS
SELECT {keys}, value FROM {table} WHERE txid = %(txid)s AND attempt = %(attempt)s;
DELETE FROM {table} WHERE txid = %(txid)s AND attempt = %(attempt)s;
INSERT INTO {table} (txid, attempt, {keys}, value)
SELECT %(txid)s, %(attempt)s, {keys}, coalesce(n.value, 0) - coalesce(o.value, 0)
FROM txn_new n FULL JOIN (
    SELECT {keys}, sum(s.value) AS value FROM {table} s JOIN {s}.commits c
        ON c.topology_id = %(topology)s AND c.txid = s.txid AND c.attempt = s.attempt
    WHERE s.txid = ANY(%(old)s) GROUP BY {keys}) o USING ({keys})
WHERE coalesce(n.value, 0) <> coalesce(o.value, 0);
DROP TABLE txn_new

-- name: correction_settle_quarantine
-- Records the old txids quarantined (and no correction counted yet) that the correction read
-- without quarantining them: it counted them. Those it quarantined again stay with their txid.
UPDATE {s}.quarantine o SET corrected_by = %(txid)s
WHERE o.topology_id = %(topology)s AND o.txid = ANY(%(old)s) AND o.committed AND o.corrected_by IS NULL
  AND o.source_offset NOT LIKE 'commit:%%'
  AND NOT EXISTS (SELECT 1 FROM {s}.quarantine n WHERE n.topology_id = o.topology_id AND n.txid = %(txid)s
                  AND n.attempt = %(attempt)s AND n.source_offset = o.source_offset
                  AND n.event_id IS NOT DISTINCT FROM o.event_id);
DELETE FROM {s}.quarantine n WHERE n.topology_id = %(topology)s AND n.txid = %(txid)s AND n.attempt = %(attempt)s
  AND EXISTS (SELECT 1 FROM {s}.quarantine o WHERE o.topology_id = n.topology_id AND o.txid = ANY(%(old)s)
              AND o.committed AND o.corrected_by IS NULL AND o.source_offset = n.source_offset
              AND o.event_id IS NOT DISTINCT FROM n.event_id);
SELECT count(*) FROM {s}.quarantine WHERE topology_id = %(topology)s AND txid = %(txid)s

-- name: replay_take
-- The committed quarantined records a replay takes -- not replayed nor counted yet, and records
-- of the source (not a commit's set-aside sums) -- marked as taken by it; what each would replay.
UPDATE {s}.quarantine q SET replayed_by = %(txid)s
WHERE q.topology_id = %(topology)s AND q.committed AND q.replayed_by IS NULL AND q.corrected_by IS NULL
  AND q.source_offset NOT LIKE 'commit:%%'
  AND (%(ids)s::bigint[] IS NULL OR q.id = ANY(%(ids)s::bigint[]))
  AND (%(first)s::bigint IS NULL OR q.txid BETWEEN %(first)s AND %(last)s)
  AND (%(reason)s::text IS NULL OR q.reason = %(reason)s)
RETURNING q.id, q.txid, coalesce(q.edited_record, CASE WHEN q.record_length <= length(q.record) THEN q.record END)
    IS NOT NULL AS whole

-- name: replay_why_not
-- Why records of the quarantine cannot be replayed (none: they can).
SELECT i AS id, CASE WHEN q.id IS NULL THEN 'not in the quarantine of this topology'
                     WHEN NOT q.committed THEN 'of an attempt that did not commit'
                     WHEN q.corrected_by IS NOT NULL THEN 'already counted by txid ' || q.corrected_by
                     WHEN q.replayed_by IS NOT NULL THEN 'already replayed by txid ' || q.replayed_by
                     WHEN q.source_offset LIKE 'commit:%%' THEN 'a sum the commit set aside, not a record' END
FROM unnest(%(ids)s::bigint[]) i LEFT JOIN {s}.quarantine q ON q.id = i AND q.topology_id = %(topology)s
WHERE q.id IS NULL OR NOT q.committed OR q.corrected_by IS NOT NULL OR q.replayed_by IS NOT NULL
   OR q.source_offset LIKE 'commit:%%'
ORDER BY i

-- name: replay_versions
-- The records a replay took that are a correction's retraction or new version upstream: the replay
-- applies them as the batch that quarantined them would have (rows of sources.base.Versions.of).
SELECT q.source_offset, v.origin, v.retraction, v.txid FROM {s}.quarantine q
JOIN {s}.log_versions v ON v.event_id = q.event_id
WHERE q.topology_id = %(topology)s AND q.id = ANY(%(ids)s::bigint[])

-- name: replay_records
-- What a replay reads: each record it took, as edited if it was, where it came from.
SELECT source_offset, event_id, coalesce(edited_record, record) AS payload FROM {s}.quarantine
WHERE topology_id = %(topology)s AND id = ANY(%(ids)s::bigint[]) ORDER BY id

-- name: replay_settle
-- At the replay's commit: the records it took that it did not quarantine again were counted by it.
UPDATE {s}.quarantine o SET corrected_by = %(txid)s
WHERE o.topology_id = %(topology)s AND o.replayed_by = %(txid)s AND o.txid <> %(txid)s
  AND NOT EXISTS (SELECT 1 FROM {s}.quarantine n WHERE n.topology_id = o.topology_id AND n.txid = %(txid)s
                  AND n.attempt = %(attempt)s AND n.source_offset = o.source_offset
                  AND n.event_id IS NOT DISTINCT FROM o.event_id);
SELECT count(*) FROM {s}.quarantine WHERE topology_id = %(topology)s AND txid = %(txid)s

-- name: quarantine_edit
-- An operator's edit of a quarantined record, replayed in its place (only before it is replayed).
UPDATE {s}.quarantine SET edited_record = %(record)s, edited_at = clock_timestamp()
WHERE topology_id = %(topology)s AND id = %(id)s AND replayed_by IS NULL AND corrected_by IS NULL
RETURNING id

-- name: quarantine_list
-- Committed quarantined records (of one txid, one reason), with whether a replay or a correction took them.
SELECT id, txid, source_offset, event_id, reason, record, record_length, edited_record, corrected_by, replayed_by
FROM {s}.quarantine WHERE topology_id = %(topology)s AND committed AND txid = coalesce(%(txid)s, txid)
    AND reason = coalesce(%(reason)s, reason)
ORDER BY id LIMIT %(limit)s

-- name: correction_preview
-- What a correction of the old txids would apply, per key: the recomputed value ({recomputed}, a
-- load table) less what they applied; the keys that differ (the largest differences first), with
-- how many differ and the totals before and after.
WITH o AS (SELECT {keys}, sum(s.value) AS value FROM {table} s JOIN {s}.commits c
               ON c.topology_id = %(topology)s AND c.txid = s.txid AND c.attempt = s.attempt
           WHERE s.txid = ANY(%(old)s) GROUP BY {keys}),
     d AS (SELECT concat_ws(',', {keys}) AS key, coalesce(o.value, 0) AS old, coalesce(n.value, 0) AS new
           FROM {recomputed} n FULL JOIN o USING ({keys}))
SELECT (SELECT count(*) FROM d WHERE old <> new) AS changed, (SELECT sum(old) FROM d) AS old_total,
       (SELECT sum(new) FROM d) AS new_total,
       (SELECT coalesce(jsonb_agg(jsonb_build_array(key, old, new)), '[]') FROM (
            SELECT key, old, new FROM d WHERE old <> new ORDER BY abs(new - old) DESC, key LIMIT %(samples)s) x)
           AS samples

-- name: correction_codes
-- The code each of some txids was committed with.
SELECT code FROM {s}.commits WHERE topology_id = %(topology)s AND txid = ANY(%(txids)s) ORDER BY txid

-- name: correction_keys
-- Some keys of one (txid, attempt)'s staged rows, as text.
SELECT concat_ws(',', {keys}) FROM {table} WHERE txid = %(txid)s AND attempt = %(attempt)s ORDER BY 1 LIMIT 10

-- name: correction_withdraw
-- A correction or replay withdrawn before it committed: it says why, and a replay's records are
-- free to be replayed again.
UPDATE {s}.transactions SET corrects = corrects || jsonb_build_object('withdrawn', %(reason)s::text)
WHERE topology_id = %(topology)s AND txid = %(txid)s;
UPDATE {s}.quarantine SET replayed_by = NULL WHERE topology_id = %(topology)s AND replayed_by = %(txid)s

-- name: correction_compensation
-- What a correction's staged events (what the fixed code emits for the corrected range, in
-- {staging} at (txid, attempt)) make of what the old txids appended, as the temporary table
-- txn_compensation. Per (output, origin), against the latest event they appended (a retraction or
-- a new version counts as its origin's): an event emitted as it was goes; one no longer emitted as
-- it was is retracted ('<origin>~retracted@<txid>': its payload, in its partition, before the
-- others); one emitted anew or otherwise is a new version ('<origin>~v<txid>') when the range had
-- appended it or a correction retracted it, itself when its id is free, and nothing when another
-- txid appended it (the log's dedupe, as for any event). What the range retracted in turn of an
-- upstream correction stays retracted: the fixed code's retractions are left out.
CREATE TEMP TABLE txn_events ON COMMIT DROP AS
SELECT output, partition, seq, event_id, payload FROM {staging}
WHERE txid = %(txid)s AND attempt = %(attempt)s AND retraction IS NOT TRUE;
CREATE TEMP TABLE txn_live ON COMMIT DROP AS
SELECT DISTINCT ON (a.output, a.origin) a.output, a.log_name, a.partition, a.payload, a.origin, a.retraction
FROM (SELECT r.output, r.log_name, r.txid, e.partition, e.payload, coalesce(v.origin, e.event_id) AS origin,
             coalesce(v.retraction, false) AS retraction
      FROM {s}.output_ranges r
      JOIN {s}.log_events e ON e.log_name = r.log_name AND e.partition = r.partition
                           AND e.lsn BETWEEN r.first_lsn AND r.last_lsn
      LEFT JOIN {s}.log_versions v ON v.log_name = e.log_name AND v.event_id = e.event_id
      WHERE r.topology_id = %(topology)s AND r.txid = ANY(%(old)s)) a
ORDER BY a.output, a.origin, a.txid DESC, a.retraction;
CREATE TEMP TABLE txn_compensation ON COMMIT DROP AS
WITH targets AS (SELECT * FROM unnest(%(outputs)s::text[], %(logs)s::text[]) AS t(output, log_name)),
retracted AS (
    SELECT l.output, l.log_name, l.partition, -1::bigint AS seq, l.origin || '~retracted@' || %(txid)s AS event_id,
           l.payload, l.origin, true AS retraction
    FROM txn_live l
    WHERE NOT l.retraction AND NOT EXISTS (SELECT 1 FROM txn_events n WHERE n.output = l.output
                                           AND n.event_id = l.origin AND n.payload = l.payload)),
emitted AS (
    SELECT n.output, t.log_name, n.partition, n.seq, n.payload, n.event_id AS origin, l.origin IS NOT NULL AS in_range,
           (SELECT v.retraction FROM {s}.log_versions v WHERE v.log_name = t.log_name AND v.origin = n.event_id
            ORDER BY v.txid DESC, v.retraction LIMIT 1) AS latest_retracted,
           EXISTS (SELECT 1 FROM {s}.log_events k WHERE k.log_name = t.log_name AND k.event_id = n.event_id)
           OR EXISTS (SELECT 1 FROM {s}.log_retired_ids k WHERE k.log_name = t.log_name
                      AND k.event_id = n.event_id) AS held
    FROM txn_events n JOIN targets t USING (output)
    LEFT JOIN txn_live l ON l.output = n.output AND l.origin = n.event_id
    WHERE l.origin IS NULL OR l.retraction OR l.payload <> n.payload)
SELECT output, log_name, partition, seq, event_id, payload, origin, retraction FROM retracted
UNION ALL
SELECT output, log_name, partition, seq,
       CASE WHEN in_range OR latest_retracted THEN origin || '~v' || %(txid)s ELSE origin END, payload, origin, false
FROM emitted WHERE in_range OR latest_retracted OR (latest_retracted IS NULL AND NOT held);
DROP TABLE txn_events, txn_live

-- name: correction_compensate
-- A correction's commit: its staged events replaced by their compensation (correction_compensation),
-- each retraction and version recorded in log_versions (the commit appends them); how many, by output.
DELETE FROM {staging} WHERE txid = %(txid)s AND attempt = %(attempt)s;
INSERT INTO {s}.log_versions (log_name, event_id, origin, retraction, topology_id, txid)
SELECT log_name, event_id, origin, retraction, %(topology)s, %(txid)s FROM txn_compensation WHERE event_id <> origin;
INSERT INTO {staging} (txid, attempt, output, partition, seq, event_id, payload)
SELECT %(txid)s, %(attempt)s, output, partition, seq, event_id, payload FROM txn_compensation;
DROP TABLE txn_compensation;
SELECT output, count(*) FROM {staging} WHERE txid = %(txid)s AND attempt = %(attempt)s GROUP BY output

-- name: correction_compensation_counts
-- A preview's: what the compensation would append, by output -- retractions, new versions (of an
-- event appended before), events appended under their own id.
SELECT output, count(*) FILTER (WHERE retraction), count(*) FILTER (WHERE NOT retraction AND event_id <> origin),
       count(*) FILTER (WHERE event_id = origin)
FROM txn_compensation GROUP BY output

-- name: correction_compensation_drop
DROP TABLE txn_compensation

-- name: correction_outputs_gone
-- The old txids' appended events that retention removed (a retraction needs their payloads).
SELECT r.txid, r.log_name, r.partition, r.first_lsn, least(r.last_lsn, p.truncated_through)
FROM {s}.output_ranges r JOIN {s}.log_partitions p ON p.log_name = r.log_name AND p.partition = r.partition
WHERE r.topology_id = %(topology)s AND r.txid = ANY(%(old)s) AND r.first_lsn <= p.truncated_through
ORDER BY r.txid, r.log_name, r.partition

-- name: correction_log_readers
-- The registered topologies that read one of the given event logs of this schema, or Kafka topics.
SELECT topology_id, spec FROM {s}.topologies
WHERE (spec->'source'->>'kind' = 'postgres_log' AND spec->'source'->>'log' = ANY(%(logs)s)
       AND coalesce(spec->'source'->>'schema', %(schema)s) = %(schema)s)
   OR (spec->'source'->>'kind' = 'kafka' AND spec->'source'->>'topic' = ANY(%(topics)s))
ORDER BY topology_id

-- name: correction_applied
-- What the old txids applied to a state: how many keys, and the sum of their deltas.
SELECT count(DISTINCT ({keys})), coalesce(sum(s.value), 0) FROM {table} s
JOIN {s}.commits c ON c.topology_id = %(topology)s AND c.txid = s.txid AND c.attempt = s.attempt
WHERE s.txid = ANY(%(old)s)

-- name: correction_preview_record
INSERT INTO {s}.correction_previews (topology_id, first_txid, last_txid, result)
VALUES (%(topology)s, %(first)s, %(last)s, %(result)s)
ON CONFLICT (topology_id, first_txid, last_txid) DO UPDATE SET result = EXCLUDED.result, previewed_at = now()

-- name: correction_preview_last
SELECT result, previewed_at FROM {s}.correction_previews
WHERE topology_id = %(topology)s AND first_txid = %(first)s AND last_txid = %(last)s
