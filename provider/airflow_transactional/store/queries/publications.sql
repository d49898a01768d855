-- The publications table: how far each output published to Kafka is (core/publish.py).

-- name: publication_get
SELECT published_txid, topic_offsets FROM {s}.publications WHERE topology_id = %(topology)s AND output = %(output)s

-- name: publication_record
-- A txid published (its Kafka transaction committed), and the topic's end offsets after it.
INSERT INTO {s}.publications (topology_id, output, topic, published_txid, topic_offsets, published_at)
VALUES (%(topology)s, %(output)s, %(topic)s, %(txid)s, %(offsets)s, clock_timestamp())
ON CONFLICT (topology_id, output) DO UPDATE SET topic = EXCLUDED.topic,
    published_txid = greatest(publications.published_txid, EXCLUDED.published_txid),
    topic_offsets = EXCLUDED.topic_offsets, published_at = EXCLUDED.published_at

-- name: publication_lock
-- One publisher of an output at a time (a second one would fence the first in Kafka anyway).
SELECT pg_try_advisory_lock(hashtext(%(key)s))

-- name: publication_unlock
SELECT pg_advisory_unlock(hashtext(%(key)s))
