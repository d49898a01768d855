-- What a Kafka topology's committed batches skipped: offsets that held no committed record for a
-- read_committed reader (aborted transactions' records, transaction markers). A batch's plan
-- spans offsets (transactions.planned_records, without offsets lost to retention); its commit
-- read records (commits.records_read); the commit adds the difference here.
ALTER TABLE {s}.topologies ADD COLUMN offsets_skipped bigint NOT NULL DEFAULT 0;

-- What the commits before this version skipped, from the same two numbers.
UPDATE {s}.topologies t SET offsets_skipped = coalesce((
    SELECT sum(greatest(x.planned_records - c.records_read, 0))
    FROM {s}.commits c JOIN {s}.transactions x USING (topology_id, txid)
    WHERE c.topology_id = t.topology_id AND c.attempt > 0), 0)
WHERE t.spec -> 'source' ->> 'kind' = 'kafka';

-- A run-time role granted before this version moves the new total with the checkpoint.
DO $carry$
DECLARE
    r name;
BEGIN
    FOR r IN SELECT a.rolname FROM pg_catalog.pg_roles a
             WHERE a.rolname <> current_user AND NOT a.rolsuper
               AND has_column_privilege(a.oid, '{s}.topologies'::regclass, 'lost_records', 'UPDATE')
               AND NOT pg_has_role(a.oid, current_user, 'MEMBER') LOOP
        EXECUTE format('GRANT UPDATE (offsets_skipped) ON %s TO %I', '{s}.topologies'::regclass, r);
    END LOOP;
END
$carry$;
