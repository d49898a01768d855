-- What produced each attempt and each commit, and what each commit changed (docs/guides/corrections.md).
-- code: the digests of the Spark application, the provider and the declaration an attempt ran with,
-- and the Airflow DAG version of its run; digests: per state, the rows a commit applied and a hash of
-- them ("rows:hash", the same for the same deltas whatever their order).
ALTER TABLE {s}.attempts ADD COLUMN code jsonb;
ALTER TABLE {s}.commits ADD COLUMN code jsonb, ADD COLUMN digests jsonb;

-- The delta history: a commit keeps its attempt's staged rows (the per-key deltas it applied) in the
-- state's staging table instead of deleting them; the rows of a (txid, attempt) that has a commit row
-- are the history. history_from_txid: the history has every txid after it; history_base: whether the
-- rows at history_from_txid are a snapshot of each state as of that txid (0: the empty state), so
-- that the state as of any later txid can be computed. A topology that committed before this version
-- starts its history at its committed txid, without a snapshot ('airflow-txn history --snapshot').
ALTER TABLE {s}.topologies ADD COLUMN history_from_txid bigint NOT NULL DEFAULT 0,
                           ADD COLUMN history_base boolean NOT NULL DEFAULT true;
UPDATE {s}.topologies SET history_from_txid = committed_txid, history_base = (committed_txid = 0);

-- Corrections: a transaction that re-processes committed txids under the current code and commits
-- the difference (corrects names the txids), or replays quarantined records (it names the
-- records and the txids they came from); null for a batch of new records. A quarantined record
-- counted by a correction names it (corrected_by): it is counted at most once. A replay takes its
-- records when it is planned (replayed_by): each is replayed at most once, as it is or as edited
-- (edited_record); one that fails again is quarantined anew, by the replay, with its new reason.
ALTER TABLE {s}.transactions ADD COLUMN corrects jsonb;
ALTER TABLE {s}.commits ADD COLUMN corrects jsonb;
ALTER TABLE {s}.quarantine ADD COLUMN corrected_by bigint, ADD COLUMN replayed_by bigint,
                           ADD COLUMN edited_record text, ADD COLUMN edited_at timestamptz;
