-- Where a publisher put a correction's retractions in its Kafka topic (core/publish.py), recorded
-- with the txid's publication: a topology of this store reading that topic takes each back,
-- negated, as a reader of the log does (sources/kafka.py), where a reader that does not know it
-- quarantines the record by its header. The cluster and topic ids are those a reader's batch
-- names: a topic of the same name on another cluster, or recreated, is not this one.
CREATE TABLE {s}.published_retractions (
    cluster_id   text NOT NULL,
    topic_id     text NOT NULL,
    partition    integer NOT NULL,
    kafka_offset bigint NOT NULL,
    topic        text NOT NULL,
    origin       text NOT NULL,
    topology_id  text NOT NULL,
    txid         bigint NOT NULL,
    PRIMARY KEY (cluster_id, topic_id, partition, kafka_offset)
);
