-- How often a txid's processing failed as Airflow saw it (one per failed try of the process task),
-- and the last reason, in one line: a driver killed before it registered an attempt leaves no
-- attempt row, and the txid would otherwise show as merely planned.
ALTER TABLE {s}.transactions ADD COLUMN failed_tries integer NOT NULL DEFAULT 0;
ALTER TABLE {s}.transactions ADD COLUMN last_try_failure text;
ALTER TABLE {s}.transactions ADD COLUMN last_try_failed_at timestamptz;
