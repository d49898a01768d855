-- Corrections (core/corrections.py): committed txids re-processed, their difference committed as a
-- txid of its own. {table}: a state's staging table (its delta history), {keys} its key columns.

-- name: correction_committed_txns
-- The committed transactions first..last, in order.
SELECT {columns} FROM {s}.transactions WHERE topology_id = %(topology)s AND txid BETWEEN %(first)s AND %(last)s
    AND status = 'committed' ORDER BY txid

-- name: correction_ranges
-- Every correction planned (through a txid, when given) and the txids it corrects.
SELECT txid, (corrects->'txids'->>0)::bigint AS first, (corrects->'txids'->>1)::bigint AS last
FROM {s}.transactions WHERE topology_id = %(topology)s AND corrects ? 'txids'
    AND txid <= coalesce(%(through)s, txid) ORDER BY txid

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
