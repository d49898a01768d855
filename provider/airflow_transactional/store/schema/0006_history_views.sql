-- Each state's delta history as a view (docs/guides/corrections.md): dlt_<num>_<state> holds, for
-- every committed txid, the deltas it applied per key -- the rows of the state's staging table whose
-- (txid, attempt) has a commit (at the txid the history starts from, after a fold or a snapshot: the
-- state as of it). Registration creates the view with the staging table; this creates those of the
-- topologies registered before it.
DO $views$
DECLARE
    t record;
    st jsonb;
BEGIN
    FOR t IN SELECT topology_id, num, spec FROM {s}.topologies LOOP
        FOR st IN SELECT jsonb_array_elements(t.spec->'states') LOOP
            IF to_regclass(format('%s.%I', '{s}', 'stg_' || t.num || '_' || (st->>'name'))) IS NOT NULL THEN
                EXECUTE format('CREATE OR REPLACE VIEW %s.%I AS SELECT s.txid, %s, s.value AS delta FROM %s.%I s '
                               'JOIN %s.commits c ON c.topology_id = %L AND c.txid = s.txid AND c.attempt = s.attempt',
                               '{s}', 'dlt_' || t.num || '_' || (st->>'name'),
                               (SELECT string_agg(format('s.%I', k), ', ') FROM jsonb_object_keys(st->'keys') k),
                               '{s}', 'stg_' || t.num || '_' || (st->>'name'), '{s}', t.topology_id);
            END IF;
        END LOOP;
    END LOOP;
END
$views$;

-- A replay takes a quarantined record that retracts an upstream event back, negated: found by the
-- record's event id.
CREATE INDEX ON {s}.log_versions (event_id);
