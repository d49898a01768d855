-- A topology reading a corrected log with output logs of its own retracts and versions its events
-- in turn (docs/guides/corrections.md): its attempt stages, for a retraction it read, the
-- retraction of each event the record's code emits (retraction true), and marks the other events
-- of such a batch (false); its commit resolves them against the log (store/outputs.py). NULL: a
-- batch without a correction's events, committed as before. Added to the output staging tables of
-- the topologies registered before it; registration creates the column with the table.
DO $staging$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT num FROM {s}.topologies LOOP
        IF to_regclass(format('%s.%I', '{s}', 'out_' || t.num)) IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %s.%I ADD COLUMN IF NOT EXISTS retraction boolean', '{s}', 'out_' || t.num);
        END IF;
    END LOOP;
END
$staging$;
