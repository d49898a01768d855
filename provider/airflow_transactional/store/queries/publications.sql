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

-- name: publication_retractions_record
-- Where a published txid's retractions went in the topic (a txid found published by a scan records
-- them again: nothing twice).
INSERT INTO {s}.published_retractions (cluster_id, topic_id, partition, kafka_offset, topic, origin,
    topology_id, txid)
SELECT %(cluster)s, %(topic_id)s, r.p, r.o, %(topic)s, r.origin, %(topology)s, %(txid)s
FROM unnest(%(parts)s::integer[], %(offs)s::bigint[], %(origins)s::text[]) AS r(p, o, origin)
ON CONFLICT DO NOTHING

-- name: publication_retractions_in
-- The retractions a publisher of this store put among offset ranges of a topic: partition,
-- offset, the id of the event each takes back.
SELECT t.partition, t.kafka_offset, t.origin FROM {s}.published_retractions t
JOIN unnest(%(parts)s::integer[], %(los)s::bigint[], %(his)s::bigint[]) AS r(p, lo, hi)
    ON t.partition = r.p AND t.kafka_offset >= r.lo AND t.kafka_offset < r.hi
WHERE t.cluster_id = %(cluster)s AND t.topic_id = %(topic_id)s

-- name: publication_unpublished_in_log
-- The outputs published to Kafka that appended events to one partition of a log which are not
-- published yet: the last LSN before the first of them (retention must not pass it).
SELECT r.topology_id, r.output, min(r.first_lsn) - 1 FROM {s}.output_ranges r
JOIN {s}.topologies t ON t.topology_id = r.topology_id
LEFT JOIN {s}.publications p ON p.topology_id = r.topology_id AND p.output = r.output
WHERE r.log_name = %(log)s AND r.partition = %(p)s AND r.txid > coalesce(p.published_txid, 0)
  AND EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(t.spec->'outputs', '[]')) o
              WHERE o->>'name' = r.output AND o->>'kafka_topic' IS NOT NULL)
GROUP BY r.topology_id, r.output
ORDER BY r.topology_id, r.output

-- name: publication_range_size
-- How many events the commit of a txid appended to an output (its ranges' LSN counts).
SELECT coalesce(sum(last_lsn - first_lsn + 1), 0) FROM {s}.output_ranges
WHERE topology_id = %(topology)s AND txid = %(txid)s AND output = %(output)s
