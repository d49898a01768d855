-- The last preview of a correction of each range (core/corrections.py preview: the topology's job
-- re-processed txids first..last under the code deployed then, committing nothing): what the
-- Transactions view's correction page shows beside what the range applied.
CREATE TABLE {s}.correction_previews (
    topology_id  text NOT NULL REFERENCES {s}.topologies ON DELETE CASCADE,
    first_txid   bigint NOT NULL,
    last_txid    bigint NOT NULL,
    result       jsonb NOT NULL,
    previewed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topology_id, first_txid, last_txid)
);
