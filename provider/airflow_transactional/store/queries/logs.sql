-- Event logs (the OLEP log): logs, their partitions' counters (log_partitions: next_lsn, the safe
-- point planning reads; truncated_through, what retention removed), their events (log_events), and
-- the ids of removed events (log_retired_ids), kept so a late duplicate is still known. Producers
-- append through the function append_events, the commit its output events through append_outputs
-- (store/schema), both under the partitions' locks.

-- name: log_ensure
-- Idempotent: an existing log only ever gains partitions.
INSERT INTO {s}.logs (log_name, partitions) VALUES (%(log)s, %(partitions)s)
ON CONFLICT (log_name) DO UPDATE SET partitions = greatest(logs.partitions, EXCLUDED.partitions);
INSERT INTO {s}.log_partitions (log_name, partition)
SELECT %(log)s, p FROM generate_series(0, %(partitions)s - 1) p ON CONFLICT DO NOTHING

-- name: log_partition_counts
SELECT log_name, partitions FROM {s}.logs WHERE log_name = ANY(%(logs)s)

-- name: log_partitions
-- Planning reads only the counters (never max(lsn)): O(partitions), whatever the log's size.
SELECT partition, next_lsn - 1 AS head, truncated_through FROM {log_schema}.log_partitions
WHERE log_name = %(log)s ORDER BY partition

-- name: log_read
SELECT lsn, event_id, payload FROM {log_schema}.log_events
WHERE log_name = %(log)s AND partition = %(p)s AND lsn > %(lo)s AND lsn <= %(hi)s ORDER BY lsn

-- name: log_copy_csv
-- The same records as log_read, as CSV rows offset,event_id,payload built by the server in bulk.
COPY (SELECT %(p)s::text || ':' || lsn, event_id, payload FROM {log_schema}.log_events
      WHERE log_name = %(log)s AND partition = %(p)s AND lsn > %(lo)s AND lsn <= %(hi)s ORDER BY lsn)
TO STDOUT WITH (FORMAT csv)

-- name: log_versions_in
-- The retractions and new versions among the events of LSN ranges (a correction's compensating
-- events, recorded in log_versions by the commit that appended them: few, found from there), with
-- the original event of each origin a retraction among them takes back, when it is among them too
-- (txid 0): offset, origin, retraction, the correction's txid.
WITH ranges AS (SELECT * FROM unnest(%(parts)s::integer[], %(los)s::bigint[], %(his)s::bigint[]) AS r(p, lo, hi)),
found AS (
    SELECT e.partition || ':' || e.lsn AS offset, v.origin, v.retraction, v.txid FROM {log_schema}.log_versions v
    JOIN {log_schema}.log_events e ON e.log_name = v.log_name AND e.event_id = v.event_id
    JOIN ranges r ON e.partition = r.p AND e.lsn > r.lo AND e.lsn <= r.hi
    WHERE v.log_name = %(log)s)
SELECT * FROM found
UNION ALL
SELECT e.partition || ':' || e.lsn, e.event_id, false, 0 FROM {log_schema}.log_events e
JOIN ranges r ON e.partition = r.p AND e.lsn > r.lo AND e.lsn <= r.hi
WHERE e.log_name = %(log)s AND e.event_id IN (SELECT origin FROM found WHERE retraction)

-- name: log_oldest_after
-- The age of the first event past an LSN (one index probe), by the database's clock.
SELECT extract(epoch FROM now() - appended_at) FROM {log_schema}.log_events
WHERE log_name = %(log)s AND partition = %(p)s AND lsn > %(lsn)s ORDER BY lsn LIMIT 1

-- name: log_append
-- The producers' door (append_events): under each partition's lock, in partition order, dropping
-- ids the log holds or held, refusing ids in a topology's id space.
SELECT appended, refused FROM {s}.append_events(%(log)s, %(partitions)s::integer[], %(ids)s::text[],
                                                %(payloads)s::text[])

-- name: log_partition_bounds
-- Retention: what one partition removed and holds, locked against appends.
SELECT truncated_through, next_lsn - 1 AS head FROM {s}.log_partitions
WHERE log_name = %(log)s AND partition = %(p)s FOR UPDATE

-- name: log_truncate
-- The ids of removed events are kept, so a late duplicate delivery is still recognised and dropped.
WITH gone AS (DELETE FROM {s}.log_events WHERE log_name = %(log)s AND partition = %(p)s AND lsn <= %(lsn)s
              RETURNING event_id)
INSERT INTO {s}.log_retired_ids (log_name, event_id) SELECT %(log)s, event_id FROM gone ON CONFLICT DO NOTHING

-- name: log_truncated_through
UPDATE {s}.log_partitions SET truncated_through = %(lsn)s WHERE log_name = %(log)s AND partition = %(p)s

-- name: log_last_lsn
-- The highest LSN a partition holds (0: none).
SELECT coalesce(max(lsn), 0) FROM {s}.log_events WHERE log_name = %(log)s AND partition = %(p)s

-- name: log_rewind
-- The owner's repair of a counter set too far (the guard lets the table's owner move it back
-- while airflow_transactional.repair_log is on, in this transaction only).
SELECT set_config('airflow_transactional.repair_log', 'on', true);
UPDATE {s}.log_partitions SET next_lsn = %(lsn)s WHERE log_name = %(log)s AND partition = %(p)s
