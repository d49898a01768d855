-- What each processing attempt read: a digest of its records' offsets (how many, and the sum of
-- their CRC-32s). The first attempt of a plan to complete fixes its transaction's digest; a later
-- attempt of the same plan that read other records -- a source changed under the plan, compacted
-- or truncated -- cannot complete in a transactional topology (an opaque one takes the new batch).
ALTER TABLE {s}.attempts ADD COLUMN read_digest text;
ALTER TABLE {s}.transactions ADD COLUMN read_digest text;

-- Where each commit appended its output events: per (txid, output, partition) the range of LSNs,
-- which only that commit wrote (it held the partition's lock), so a publisher reads exactly a
-- txid's events.
CREATE TABLE {s}.output_ranges (
    topology_id text NOT NULL REFERENCES {s}.topologies ON DELETE CASCADE,
    txid        bigint NOT NULL,
    output      text NOT NULL,
    log_name    text NOT NULL,
    partition   integer NOT NULL,
    first_lsn   bigint NOT NULL,
    last_lsn    bigint NOT NULL,
    PRIMARY KEY (topology_id, txid, output, partition)
);

-- How far each output published to Kafka is: the last txid published, and the topic's end offsets
-- after it -- where a publisher that restarts looks for a later txid it published before it could
-- record it here.
CREATE TABLE {s}.publications (
    topology_id    text NOT NULL REFERENCES {s}.topologies ON DELETE CASCADE,
    output         text NOT NULL,
    topic          text NOT NULL,
    published_txid bigint NOT NULL DEFAULT 0,
    topic_offsets  jsonb NOT NULL DEFAULT '{{}}',
    published_at   timestamptz,
    PRIMARY KEY (topology_id, output)
);
