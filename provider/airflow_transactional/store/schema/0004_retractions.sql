-- Compensating events (core/corrections.py): a correction of a topology with output logs appends,
-- for each event its txids appended that the fixed code no longer emits as it was, a retraction
-- ('<origin>~retracted@<txid>', the retracted event's payload, in its partition), and for each
-- event the fixed code emits anew or otherwise, a new version ('<origin>~v<txid>' when the origin's
-- id is taken, else the origin's own id). Each is recorded here in the same transaction as its
-- append: a reader of the log (sources/pglog.py) knows a retraction by this row and applies it
-- negated; origin is the log's id of the event it retracts or versions.
CREATE TABLE {s}.log_versions (
    log_name    text NOT NULL,
    event_id    text NOT NULL,
    origin      text NOT NULL,
    retraction  boolean NOT NULL,
    topology_id text NOT NULL,
    txid        bigint NOT NULL,
    PRIMARY KEY (log_name, event_id)
);
CREATE INDEX ON {s}.log_versions (log_name, origin);
