-- Record limits, a commit that appends through a door, and a repair of a log's counter.

-- A record is at most 1 MiB (limits.MAX_RECORD_BYTES): landing files say whether every line is
-- within it and escapes no surrogate ("plain": Spark's JSON reader may read the file as it is;
-- null: registered before this was looked at, read as text and judged line by line).
ALTER TABLE {s}.landing_files ADD COLUMN plain boolean;

-- The producers' door refuses a payload over the record limit, as it refuses a long id.
CREATE OR REPLACE FUNCTION {s}.append_events(log text, partitions integer[], ids text[], payloads text[],
                                  OUT appended bigint, OUT duplicates bigint, OUT refused text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    known integer;
    reserved text[];
    part integer;
    base bigint;
    handed bigint;
    inserted bigint;
BEGIN
    IF NOT (pg_has_role(session_user, current_user, 'MEMBER') OR EXISTS (
            SELECT 1 FROM {s}.log_writers w WHERE w.log_name = append_events.log
            AND pg_has_role(session_user, w.role_name, 'MEMBER'))) THEN
        RAISE EXCEPTION 'role % may not append to log %', session_user, append_events.log
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'the schema''s owner grants it: airflow-txn grant --producer-role ROLE --log LOG';
    END IF;
    SELECT l.partitions INTO known FROM {s}.logs l WHERE l.log_name = append_events.log;
    IF known IS NULL THEN
        RAISE EXCEPTION 'log % does not exist', append_events.log USING ERRCODE = 'undefined_object';
    END IF;
    IF cardinality(ids) IS DISTINCT FROM cardinality(partitions)
            OR cardinality(ids) IS DISTINCT FROM cardinality(payloads) THEN
        RAISE EXCEPTION 'append_events takes as many partitions, ids and payloads' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(partitions) p WHERE p IS NULL OR p < 0 OR p >= known)
            OR EXISTS (SELECT 1 FROM unnest(ids, payloads) AS r(id, payload) WHERE r.id IS NULL OR r.payload IS NULL) THEN
        RAISE EXCEPTION 'log % has partitions 0..%, and every event an id and a payload', append_events.log, known - 1
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT coalesce(array_agg(t.topology_id || ':'), '{{}}') INTO reserved FROM {s}.topologies t
    WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(t.spec->'outputs', '[]')) o
                  WHERE o->>'log' = append_events.log);
    refused := ARRAY(SELECT r.id FROM unnest(ids, payloads) AS r(id, payload)
                     WHERE octet_length(r.id) > 512 OR octet_length(r.payload) > 1048576
                     OR EXISTS (SELECT 1 FROM unnest(reserved) p WHERE starts_with(r.id, p)));
    appended := 0;
    FOR part IN SELECT DISTINCT p FROM unnest(partitions) p ORDER BY p LOOP
        SELECT lp.next_lsn INTO base FROM {s}.log_partitions lp
        WHERE lp.log_name = append_events.log AND lp.partition = part FOR UPDATE;
        -- OFFSET 0 keeps each NOT EXISTS one index probe per event (a join, on a log grown since its statistics, nests a scan of the log under each event).
        WITH given AS (SELECT r.p, r.id, r.payload, r.ord FROM unnest(partitions, ids, payloads) WITH ORDINALITY
                       AS r(p, id, payload, ord) WHERE NOT r.id = ANY(refused)),
        first AS (SELECT DISTINCT ON (g.id) g.* FROM given g ORDER BY g.id, g.ord),
        fresh AS (SELECT f.* FROM first f WHERE f.p = part
                  AND NOT EXISTS (SELECT 1 FROM {s}.log_events k WHERE k.log_name = append_events.log
                                  AND k.event_id = f.id OFFSET 0)
                  AND NOT EXISTS (SELECT 1 FROM {s}.log_retired_ids k WHERE k.log_name = append_events.log
                                  AND k.event_id = f.id OFFSET 0)),
        numbered AS (SELECT base + row_number() OVER (ORDER BY f.ord) - 1 AS lsn, f.id, f.payload FROM fresh f),
        ins AS (INSERT INTO {s}.log_events (log_name, partition, lsn, event_id, payload)
                SELECT append_events.log, part, n.lsn, n.id, n.payload FROM numbered n
                ON CONFLICT (log_name, event_id) DO NOTHING RETURNING 1)
        SELECT (SELECT count(*) FROM numbered), (SELECT count(*) FROM ins) INTO handed, inserted;
        -- a concurrent append of the same id to another partition can still win the unique
        -- index: its LSN stays a harmless gap; the counter moves past every LSN handed out
        UPDATE {s}.log_partitions lp SET next_lsn = base + handed
        WHERE lp.log_name = append_events.log AND lp.partition = part;
        appended := appended + inserted;
    END LOOP;
    duplicates := cardinality(ids) - cardinality(refused) - appended;
END
$body$;

-- The commit's door into a log (store/outputs.py): the run-time role appends a txid's output
-- events through it and needs neither UPDATE on log_partitions nor INSERT on log_events -- with
-- them it could set a partition's counter to the largest bigint (every later append failing,
-- and the forward-only guard refusing any rewind) or write any event into any log. Under the
-- partition's lock, it leaves out ids the log holds or held, numbers the rest from the next LSN
-- in the order given, and advances the counter past them; an id held with another payload is
-- reported (clash), not appended. first_lsn is null when the log has no such partition.
CREATE FUNCTION {s}.append_outputs(log text, part integer, ids text[], payloads text[],
                                   OUT first_lsn bigint, OUT handed_out bigint, OUT inserted bigint,
                                   OUT clash text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    SELECT lp.next_lsn INTO first_lsn FROM {s}.log_partitions lp
    WHERE lp.log_name = append_outputs.log AND lp.partition = part FOR UPDATE;
    IF first_lsn IS NULL THEN
        RETURN;
    END IF;
    IF cardinality(ids) IS DISTINCT FROM cardinality(payloads)
            OR EXISTS (SELECT 1 FROM unnest(ids, payloads) AS r(id, payload) WHERE r.id IS NULL OR r.payload IS NULL) THEN
        RAISE EXCEPTION 'append_outputs takes as many ids as payloads, none null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- OFFSET 0 keeps each probe one index lookup per event (see append_events).
    WITH given AS (
        SELECT r.id, r.payload, r.ord,
               (SELECT k.payload FROM {s}.log_events k WHERE k.log_name = append_outputs.log AND k.event_id = r.id
                OFFSET 0) AS held,
               EXISTS (SELECT 1 FROM {s}.log_retired_ids k WHERE k.log_name = append_outputs.log
                       AND k.event_id = r.id OFFSET 0) AS retired
        FROM unnest(ids, payloads) WITH ORDINALITY AS r(id, payload, ord)),
    numbered AS (SELECT first_lsn + row_number() OVER (ORDER BY g.ord) - 1 AS lsn, g.id, g.payload
                 FROM given g WHERE g.held IS NULL AND NOT g.retired),
    ins AS (INSERT INTO {s}.log_events (log_name, partition, lsn, event_id, payload)
            SELECT append_outputs.log, part, n.lsn, n.id, n.payload FROM numbered n
            ON CONFLICT (log_name, event_id) DO NOTHING RETURNING 1)
    SELECT (SELECT count(*) FROM numbered), (SELECT count(*) FROM ins),
           (SELECT g.id FROM given g WHERE g.held <> g.payload ORDER BY g.id LIMIT 1)
    INTO handed_out, inserted, clash;
    IF clash IS NULL AND handed_out > 0 THEN
        UPDATE {s}.log_partitions lp SET next_lsn = first_lsn + handed_out
        WHERE lp.log_name = append_outputs.log AND lp.partition = part;
    END IF;
END
$body$;
REVOKE ALL ON FUNCTION {s}.append_outputs(text, integer, text[], text[]) FROM PUBLIC;

-- The owner's repair of a partition's counter (airflow-txn repair-log): inside a transaction
-- that set airflow_transactional.repair_log to 'on', the table's owner may move next_lsn back --
-- never to an LSN the partition holds (nor below what a reader planned: sources/eventlog.py
-- checks). Nobody else may: the run-time role and producers reach the counter only through the
-- doors above.
CREATE OR REPLACE FUNCTION {s}.log_partition_guard() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    IF NEW.next_lsn < OLD.next_lsn AND coalesce(current_setting('airflow_transactional.repair_log', true), '') = 'on'
            AND pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID),
                            'MEMBER')
            AND NEW.truncated_through = OLD.truncated_through AND NEW.truncated_through < NEW.next_lsn
            AND NOT EXISTS (SELECT 1 FROM {s}.log_events e WHERE e.log_name = NEW.log_name
                            AND e.partition = NEW.partition AND e.lsn >= NEW.next_lsn) THEN
        RETURN NEW;
    END IF;
    IF NEW.next_lsn < OLD.next_lsn OR NEW.truncated_through < OLD.truncated_through
            OR NEW.truncated_through >= NEW.next_lsn THEN
        RAISE EXCEPTION 'log % partition %: next_lsn and truncated_through only move forward, and retention stops '
                        'at the head (next_lsn % -> %, truncated_through % -> %)', OLD.log_name, OLD.partition,
                        OLD.next_lsn, NEW.next_lsn, OLD.truncated_through, NEW.truncated_through
            USING ERRCODE = 'check_violation',
                  HINT = 'a counter set too far by mistake is repaired by the schema''s owner: airflow-txn repair-log LOG';
    END IF;
    RETURN NEW;
END
$body$;

-- A run-time role granted before this version (UPDATE on next_lsn and INSERT on log_events, for
-- the commit's output events) gets the commit's door instead, now: its commits go on through
-- append_outputs, and the rights that let it set a counter or forge an event go at once, not at
-- the owner's next 'airflow-txn grant'; it may record a landing file's "plain" too.
DO $carry$
DECLARE
    r name;
BEGIN
    FOR r IN SELECT a.rolname FROM pg_catalog.pg_roles a
             WHERE a.rolname <> current_user AND NOT a.rolsuper
               AND has_column_privilege(a.oid, '{s}.log_partitions'::regclass, 'next_lsn', 'UPDATE')
               AND NOT pg_has_role(a.oid, current_user, 'MEMBER') LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I',
                       '{s}.append_outputs(text, integer, text[], text[])'::regprocedure, r);
        EXECUTE format('REVOKE UPDATE (next_lsn) ON %s FROM %I', '{s}.log_partitions'::regclass, r);
        EXECUTE format('REVOKE INSERT ON %s FROM %I', '{s}.log_events'::regclass, r);
    END LOOP;
    -- and records what a landing file's registration now finds (a touched file's row follows it)
    FOR r IN SELECT a.rolname FROM pg_catalog.pg_roles a
             WHERE a.rolname <> current_user AND NOT a.rolsuper
               AND has_column_privilege(a.oid, '{s}.landing_files'::regclass, 'sha256', 'UPDATE')
               AND NOT pg_has_role(a.oid, current_user, 'MEMBER') LOOP
        EXECUTE format('GRANT UPDATE (plain) ON %s TO %I', '{s}.landing_files'::regclass, r);
    END LOOP;
END
$carry$;
