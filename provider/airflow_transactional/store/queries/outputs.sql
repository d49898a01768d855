-- Output logs: the events a topology's transform emits, staged per (txid, attempt) in {staging},
-- and appended to their event logs (logs, log_partitions, log_events) by the commit.

-- name: output_staging_create
-- The key refuses an attempt that emits one event id twice: a transform bug, never a silent pick
-- of one of them. An event with a request is appended only if that request of decision got the
-- verdict granted (true or false). retraction: see output_resolve (NULL in a batch that read no
-- correction's events).
CREATE TABLE IF NOT EXISTS {staging} (txid bigint NOT NULL, attempt integer NOT NULL, output text NOT NULL,
    partition integer NOT NULL, seq bigint, event_id text NOT NULL, payload text NOT NULL, decision text,
    request text, granted boolean, retraction boolean, PRIMARY KEY (txid, attempt, output, event_id))

-- name: output_staged_counts
-- Per output, how many events one (txid, attempt) staged and the sum of their hashes (its digest:
-- the same for the same events in any order).
SELECT output, count(*), coalesce(sum(hashtextextended(
    ROW(partition, event_id, payload, decision, request, granted, retraction)::text, 0)::numeric), 0)
FROM {staging} WHERE txid = %(txid)s AND attempt = %(attempt)s GROUP BY output

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

-- name: output_marked
-- Whether the attempt read a correction's events upstream: then each of its staged events says
-- whether it is a retraction (true or false), else none does (NULL).
SELECT retraction IS NOT NULL FROM {staging} WHERE txid = %(txid)s AND attempt = %(attempt)s LIMIT 1

-- name: output_resolve
-- The staged events of an attempt that read a correction's retractions and versions upstream, made
-- what the log takes (docs/guides/corrections.md), in the commit's transaction. A retraction
-- ('<id>~retracted@<txid>', staged for each event the code emits for a retraction it read) takes
-- back the live version of its id -- the latest version of it, else the event itself -- with that
-- event's payload, in its partition, before the batch's other events; none goes when it is
-- retracted already or was never appended (when retention removed it, the code's payload stands
-- for it). An event whose id the log holds (or held) goes as a new version ('<id>~v<txid>') when
-- that id is retracted (before, or by this commit), not at all when a version of it is live, and
-- as before otherwise (the log's dedupe). Retractions and versions are recorded in log_versions.
CREATE TEMP TABLE txn_staged ON COMMIT DROP AS
SELECT o.output, t.log_name, o.partition, o.seq, o.event_id, o.payload, o.decision, o.request, o.granted,
       o.retraction, CASE WHEN o.retraction THEN left(o.event_id, -length(%(suffix)s)) ELSE o.event_id END AS origin
FROM {staging} o JOIN unnest(%(outputs)s::text[], %(logs)s::text[]) AS t(output, log_name) USING (output)
WHERE o.txid = %(txid)s AND o.attempt = %(attempt)s;
ANALYZE txn_staged;
-- Joins, not a probe per event: the planner hashes what a batch of many events needs.
CREATE TEMP TABLE txn_latest ON COMMIT DROP AS
SELECT DISTINCT ON (v.log_name, v.origin) v.log_name, v.origin, v.event_id AS latest, v.retraction AS latest_retracted
FROM {s}.log_versions v JOIN (SELECT DISTINCT log_name, origin FROM txn_staged) s USING (log_name, origin)
ORDER BY v.log_name, v.origin, v.txid DESC, v.retraction;
CREATE TEMP TABLE txn_resolved ON COMMIT DROP AS
SELECT s.output, s.log_name, coalesce(e.partition, s.partition) AS partition, -1::bigint AS seq, s.event_id,
       coalesce(e.payload, s.payload) AS payload, s.decision, s.request, s.granted, s.retraction, s.origin
FROM txn_staged s
LEFT JOIN txn_latest l USING (log_name, origin)
LEFT JOIN {s}.log_events e ON e.log_name = s.log_name AND e.event_id = coalesce(l.latest, s.origin)
WHERE s.retraction AND NOT coalesce(l.latest_retracted, false)
  AND (e.event_id IS NOT NULL OR EXISTS (SELECT 1 FROM {s}.log_retired_ids k WHERE k.log_name = s.log_name
                                         AND k.event_id = coalesce(l.latest, s.origin)));
INSERT INTO txn_resolved
SELECT n.output, n.log_name, n.partition, n.seq,
       CASE WHEN n.held AND n.retracted THEN n.origin || '~v' || %(txid)s ELSE n.event_id END, n.payload, n.decision,
       n.request, n.granted, n.retraction, n.origin
FROM (SELECT s.*, l.latest_retracted, coalesce(l.latest_retracted, false) OR r.origin IS NOT NULL AS retracted,
             k.event_id IS NOT NULL OR EXISTS (SELECT 1 FROM {s}.log_retired_ids x WHERE x.log_name = s.log_name
                                               AND x.event_id = s.event_id) AS held
      FROM txn_staged s
      LEFT JOIN txn_latest l USING (log_name, origin)
      LEFT JOIN (SELECT DISTINCT output, origin FROM txn_resolved) r ON r.output = s.output AND r.origin = s.origin
      LEFT JOIN {s}.log_events k ON k.log_name = s.log_name AND k.event_id = s.event_id
      WHERE NOT s.retraction) n
WHERE NOT (n.held AND n.latest_retracted IS FALSE AND NOT n.retracted);
INSERT INTO {s}.log_versions (log_name, event_id, origin, retraction, topology_id, txid)
SELECT log_name, event_id, origin, retraction, %(topology)s, %(txid)s FROM txn_resolved WHERE event_id <> origin;
DELETE FROM {staging} WHERE txid = %(txid)s AND attempt = %(attempt)s;
INSERT INTO {staging} (txid, attempt, output, partition, seq, event_id, payload, decision, request, granted, retraction)
SELECT %(txid)s, %(attempt)s, output, partition, seq, event_id, payload, decision, request, granted, retraction
FROM txn_resolved;
DROP TABLE txn_staged, txn_latest, txn_resolved
