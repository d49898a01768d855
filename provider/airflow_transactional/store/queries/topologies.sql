-- The topologies table: one row per topology -- its declaration, its checkpoint, a running
-- rebuild's mark. Its row lock serialises the topology's plans and commits.

-- name: topology_get
-- lock: FOR UPDATE, or nothing.
SELECT num, spec, committed_txid, committed_offsets FROM {s}.topologies WHERE topology_id = %(topology)s {lock}

-- name: topology_for_registration
SELECT num, spec, committed_txid,
       EXISTS (SELECT 1 FROM {s}.transactions t WHERE t.topology_id = %(topology)s) AS planned
FROM {s}.topologies WHERE topology_id = %(topology)s FOR UPDATE

-- name: topology_upsert
INSERT INTO {s}.topologies (topology_id, spec) VALUES (%(topology)s, %(spec)s)
ON CONFLICT (topology_id) DO UPDATE SET spec = EXCLUDED.spec, updated_at = now()
RETURNING num

-- name: topology_numbered
SELECT num, spec FROM {s}.topologies ORDER BY topology_id

-- name: topology_specs
SELECT spec FROM {s}.topologies ORDER BY topology_id

-- name: topology_delete
-- Its transactions, attempts and commits go with it (ON DELETE CASCADE).
DELETE FROM {s}.topologies WHERE topology_id = %(topology)s

-- name: topology_advance
UPDATE {s}.topologies SET committed_txid = %(txid)s, committed_offsets = %(offsets)s, last_commit_at = %(at)s,
       lost_records = lost_records + %(lost)s, offsets_skipped = offsets_skipped + %(skipped)s
WHERE topology_id = %(topology)s

-- name: topology_progress
SELECT last_commit_at, lost_records, offsets_skipped FROM {s}.topologies WHERE topology_id = %(topology)s

-- name: topology_committed_shared
-- FOR SHARE holds commits off until the caller's transaction ends.
SELECT committed_txid FROM {s}.topologies WHERE topology_id = %(topology)s FOR SHARE

-- name: topology_rebuild_mark
SELECT rebuild_from_txid, rebuild_id FROM {s}.topologies WHERE topology_id = %(topology)s

-- name: topology_set_rebuild_mark
UPDATE {s}.topologies SET rebuild_from_txid = %(from_txid)s, rebuild_id = %(rebuild_id)s
WHERE topology_id = %(topology)s

-- name: topology_planned_in_log
-- The topologies of this store reading a log, and how far each planned one partition (committed or not).
SELECT t.topology_id, max(coalesce((x.end_offsets->>%(partition)s)::bigint, 0)) AS planned
FROM {s}.topologies t JOIN {s}.transactions x ON x.topology_id = t.topology_id
WHERE t.spec->'source'->>'kind' = %(kind)s AND t.spec->'source'->>'log' = %(log)s
  AND coalesce(t.spec->'source'->>'schema', %(schema)s) = %(schema)s
GROUP BY t.topology_id ORDER BY t.topology_id

-- name: topology_readers_of_log
-- The topologies of this store reading a log, and how far each committed one partition.
SELECT topology_id, coalesce((committed_offsets->>%(partition)s)::bigint, 0) AS committed FROM {s}.topologies
WHERE spec->'source'->>'kind' = %(kind)s AND spec->'source'->>'log' = %(log)s
  AND coalesce(spec->'source'->>'schema', %(schema)s) = %(schema)s
ORDER BY topology_id
