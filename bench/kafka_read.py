"""Where a Kafka batch's read goes, beside the landing directory's: ``python -m bench.kafka_read``.

The ``kafka`` section of ``bench.perf`` times whole jobs; this takes the read apart. One batch of
N events (the benchmark's events file) is in a 4-partition topic of a real broker (``dev/kafka.py``,
produced in one Kafka transaction) and in one landing file. Each row is one frame of a ``local[2]``
session written to Spark's ``noop`` sink (the best of three), as a ratio of its events/s to the
baseline's -- the landing directory read, parsed and judged by the provider's own code:

- Spark's JSON reader alone on the file;
- Spark's Kafka reader alone on the topic: through the DataSource V1 relation Spark takes for a
  batch read by default, as the provider sets it (V2, ``read_committed``), and with each setting a
  team might reach for (``read_uncommitted``, 16 MiB fetches);
- the provider's Kafka reader (:func:`airflow_transactional.spark.kafka.read_kafka`: offsets and
  ids, the UTF-8 check, the ``kafka_*`` columns), then read, parsed and judged as a job does.

The broker and the session run on the same cores, as the benchmark's do.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_transactional import KafkaSource, LandingDirectory
from airflow_transactional.spark.jars import kafka_connector
from bench.measure import write_events_file
from bench.sections.kafka import CONN_ID, PARTITIONS, produce_file, use_broker
from dev.kafka import KafkaBroker

TOPIC = "bench-read"
SCHEMA = "url string, user string, ts string"


def best_of(frame: Any, trials: int = 3) -> float:
    """Wall seconds of the fastest of ``trials`` writes of ``frame`` to the ``noop`` sink."""
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        frame.write.format("noop").mode("overwrite").save()
        best = min(best, time.perf_counter() - start)
    return best


def kafka_frame(spark: Any, broker: KafkaBroker, ranges: list[tuple[int, int, int]],
                options: dict[str, str] | None = None) -> Any:
    """Spark's Kafka reader over ``ranges`` as the provider sets it, with ``options`` on top."""
    from airflow_transactional.spark.kafka import batch_reader

    return batch_reader(spark, TOPIC, ranges).option("kafka.bootstrap.servers", broker.bootstrap).options(
        **(options or {})).load()


def rows(spark: Any, broker: KafkaBroker, events: Path, ranges: list[tuple[int, int, int]]
         ) -> list[tuple[str, Callable[[], Any]]]:
    """(what, the frame) of every row; the first is the baseline."""
    from airflow_transactional.spark.kafka import read_kafka
    from airflow_transactional.spark.read import read_landing
    from airflow_transactional.spark.validate import prepare

    landing = LandingDirectory(str(events.parent), settle_seconds=0)
    landing_batch = {"files": [{"path": str(events)}], "format": "json"}
    source = KafkaSource(TOPIC, kafka_conn_id=CONN_ID)
    kafka_batch = {"topic": TOPIC, "ranges": [list(r) for r in ranges]}
    fetch = {"kafka.max.partition.fetch.bytes": str(16 << 20), "kafka.fetch.max.bytes": str(64 << 20)}
    return [
        ("landing: read, parse and judge (the provider's)",
         lambda: prepare(read_landing(spark, landing, landing_batch, record_schema=SCHEMA), SCHEMA, ["url"]).flat),
        ("landing: Spark's JSON reader alone",
         lambda: spark.read.schema(f"{SCHEMA}, _corrupt_record string").json(str(events))),
        ("kafka: Spark's Kafka reader alone, V1 relation (Spark's default)",
         lambda: v1(lambda: kafka_frame(spark, broker, ranges))),
        ("kafka: Spark's Kafka reader alone, V2 (the provider's)",
         lambda: kafka_frame(spark, broker, ranges)),
        ("kafka: Spark's Kafka reader alone, read_uncommitted",
         lambda: kafka_frame(spark, broker, ranges, {"kafka.isolation.level": "read_uncommitted"})),
        ("kafka: Spark's Kafka reader alone, 16 MiB fetches", lambda: kafka_frame(spark, broker, ranges, fetch)),
        ("kafka: the provider's reader (ids, UTF-8 check, kafka_* columns)",
         lambda: read_kafka(spark, source, kafka_batch).df),
        ("kafka: read, parse and judge, V1 relation",
         lambda: v1(lambda: prepare(read_kafka(spark, source, kafka_batch), SCHEMA, ["url"]).flat)),
        ("kafka: read, parse and judge (the provider's)",
         lambda: prepare(read_kafka(spark, source, kafka_batch), SCHEMA, ["url"]).flat),
    ]


def v1(frame: Callable[[], Any]) -> Any:
    """``frame()`` with the provider's reader left on Spark's default DataSource V1 relation (the
    relation is chosen when the frame is loaded, by the setting of that moment)."""
    from unittest import mock

    from airflow_transactional.spark import kafka

    def default(spark: Any) -> None:
        spark.conf.set(kafka.V1_LIST, kafka.V1_SOURCES)

    with mock.patch.object(kafka, "use_v2_reader", default):
        return frame()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_read", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the batch (default 1,000,000)")
    parser.add_argument("--dir", help="where to keep the broker and the events (default: a temp dir)")
    args = parser.parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="kafka-read-"))
    events = base / "landing" / "events.json"
    events.parent.mkdir(parents=True, exist_ok=True)
    write_events_file(events, args.events, seed=args.events, distinct_urls=20_000)
    broker = KafkaBroker(base / "kafka").start()
    try:
        use_broker(broker)
        broker.create_topic(TOPIC, PARTITIONS)
        assert produce_file(broker, TOPIC, events) == args.events
        ends = broker_offsets(broker)
        return report(args.events, broker, events, ends)
    finally:
        broker.stop(remove=True)


def broker_offsets(broker: KafkaBroker) -> list[tuple[int, int, int]]:
    """(partition, low, high) of the topic (one committed transaction: its marker ends each)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**broker.client_config(), "group.id": "bench-read", "isolation.level": "read_committed"})
    try:
        return [(p, *consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)) for p in range(PARTITIONS)]
    finally:
        consumer.close()


def report(n: int, broker: KafkaBroker, events: Path, ranges: list[tuple[int, int, int]]) -> int:
    from pyspark.sql import SparkSession

    jars = ",".join(str(p) for p in kafka_connector().fetch())
    spark = (SparkSession.builder.master("local[2]").appName("bench-kafka-read").config("spark.jars", jars)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        timed = [(what, best_of(frame())) for what, frame in rows(spark, broker, events, ranges)]
    finally:
        spark.stop()
    baseline = timed[0][1]
    print(f"\none batch of {n:,} events, local[2], the best of 3 writes to the noop sink; ratio: events/s "
          f"against the first row's\n")
    print(f"| {'measure':<66} | {'seconds':>7} | {'events/s':>10} | {'ratio':>6} |")
    print(f"|{'-' * 68}|{'-' * 9}|{'-' * 12}|{'-' * 8}|")
    for what, secs in timed:
        print(f"| {what:<66} | {secs:7.2f} | {n / secs:10,.0f} | {baseline / secs:5.2f}x |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    raise SystemExit(main())
