-- Output logs: the events a topology's transform emits, staged per (txid, attempt) in {staging},
-- and appended to their event logs (logs, log_partitions, log_events) by the commit.

-- name: output_staging_create
-- The key refuses an attempt that emits one event id twice: a transform bug, never a silent pick
-- of one of them. An event with a request is appended only if that request of decision got the
-- verdict granted (true or false).
CREATE TABLE IF NOT EXISTS {staging} (txid bigint NOT NULL, attempt integer NOT NULL, output text NOT NULL,
    partition integer NOT NULL, seq bigint, event_id text NOT NULL, payload text NOT NULL, decision text,
    request text, granted boolean, PRIMARY KEY (txid, attempt, output, event_id))

-- name: output_staged_counts
SELECT output, count(*) FROM {staging} WHERE txid = %(txid)s AND attempt = %(attempt)s GROUP BY output

-- name: output_staged_partitions
SELECT DISTINCT output, partition FROM {staging} WHERE txid = %(txid)s AND attempt = %(attempt)s

-- name: output_append
-- The staged events of one partition, in (seq, event id) order, through the commit's door
-- append_outputs (store/schema/0006): under the partition's lock, ids the log holds (or held
-- before retention) left out before numbering (no LSN gap), one held with another payload reported
-- (clash). {only_verdicts}: which events emitted for a request go.
SELECT a.first_lsn, a.handed_out, a.inserted, a.clash
FROM (SELECT coalesce(array_agg(o.event_id ORDER BY o.seq, o.event_id), ARRAY[]::text[]) AS ids,
             coalesce(array_agg(o.payload ORDER BY o.seq, o.event_id), ARRAY[]::text[]) AS payloads
      FROM {staging} o
      WHERE o.txid = %(txid)s AND o.attempt = %(attempt)s AND o.output = %(output)s AND o.partition = %(p)s
        AND {only_verdicts}) AS g,
     LATERAL {s}.append_outputs(%(log)s, %(p)s, g.ids, g.payloads) AS a

-- name: output_range_record
-- Where the commit of a txid appended an output's events in one partition (its LSNs, held under the
-- partition's lock: no other writer's event is among them).
INSERT INTO {s}.output_ranges (topology_id, txid, output, log_name, partition, first_lsn, last_lsn)
VALUES (%(topology)s, %(txid)s, %(output)s, %(log)s, %(p)s, %(first)s, %(last)s)

-- name: output_events_of_txid
-- The events a txid's commit appended to an output, partition by partition, in LSN order; of a
-- retraction, the id of the event it retracts.
SELECT e.partition, e.lsn, e.event_id, e.payload, v.origin AS retracts FROM {s}.output_ranges r
JOIN {s}.log_events e ON e.log_name = r.log_name AND e.partition = r.partition
                     AND e.lsn BETWEEN r.first_lsn AND r.last_lsn
LEFT JOIN {s}.log_versions v ON v.log_name = e.log_name AND v.event_id = e.event_id AND v.retraction
WHERE r.topology_id = %(topology)s AND r.txid = %(txid)s AND r.output = %(output)s
ORDER BY e.partition, e.lsn
