"""The words job reading a Kafka topic under real spark-submit: exactly the planned offsets, by
Spark's Kafka reader at read_committed, out of order and replayed, committed in order -- the
numbers those of the records producers committed, the rest quarantined, none lost; the broker lost
under a read and back costs an attempt at most."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

import pytest

from airflow_transactional import KafkaSource, SparkJob, StateSpec, TopologySpec
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.model import RETRACTS_HEADER, read_digest
from airflow_transactional.sources.kafka import RETRACTION_REFUSED
from airflow_transactional.spark.jars import kafka_connector
from airflow_transactional.spark.submit import provider_zip
from dev.kafka import KafkaBroker
from tests.helpers import local_conf, query, spark_submit, startup_env
from tests.kafka_helpers import TransactionalProducer, create_topic, produce, read_topic

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
WORDS = str(REPO / "spark_jobs" / "words.py")


def tweets(n: int, start: int = 0) -> list[tuple[str, dict[str, str]]]:
    hosts = ["www.apache.org", "Spark.Apache.org", "example.com", "www.example.com"]
    return [(f"tw{i}", {"url": f"https://{hosts[i % 4]}/p{i % 13}", "user": f"u{i % 5}"})
            for i in range(start, start + n)]


def words(topic: str, max_batch_size: int = 400) -> TopologySpec:
    return TopologySpec("kwords", KafkaSource(topic), [
        StateSpec("url_counts", {"url": "text"}, combiner="count", table="kurl_counts"),
        StateSpec("domain_counts", {"domain": "text"}, combiner="count", kind="opaque", table="kdomain_counts"),
    ], max_batch_size=max_batch_size, max_in_flight=5, job=SparkJob(WORDS))


def submit(dsn: str, txid: int) -> None:
    res = spark_submit(dsn, WORDS, "--topology", "kwords", "--txid", str(txid),
                       jars=[str(p) for p in kafka_connector().fetch()])
    assert res.returncode == 0, res.stderr[-4000:]


def test_the_words_job_reads_exactly_the_planned_offsets_of_a_kafka_topic(dsn: str, kafka: KafkaBroker) -> None:
    topic = create_topic(kafka, 3)
    committed, aborted = tweets(900), tweets(150, start=5000)
    producer = TransactionalProducer(kafka)
    for chunk in range(0, 900, 300):
        producer.send(topic, committed[chunk:chunk + 300])
        producer.commit()
        producer.send(topic, aborted[chunk // 6:chunk // 6 + 50])
        producer.abort()
    produce(kafka, topic, [("bad", b"\xc3\x28 not utf-8"), ("gone", None), ("junk", "{not json")])
    # A corrected topology's published retraction, in a topic another store's topology reads:
    # quarantined saying what it is, never counted as the tweet it takes back.
    produce(kafka, topic, [("up:tw1~retracted@9", tweets(1)[0][1])], headers=[(RETRACTS_HEADER, "up:tw1")])
    coord = Coordinator(dsn)
    coord.register(words(topic))
    # One this store's publisher put there (recorded where it went): taken back, negated.
    produce(kafka, topic, [("up:tw2~retracted@9", committed[2][1])], headers=[(RETRACTS_HEADER, "up:tw2")])
    [(part, off)] = [(m.partition(), m.offset()) for m in read_topic(kafka, topic) if m.key() == b"up:tw2~retracted@9"]
    snapshot = KafkaSource(topic).snapshot()
    query(dsn, "INSERT INTO airflow_txn.published_retractions VALUES (%s, %s, %s, %s, %s, 'up:tw2', 'up', 9)",
          (snapshot.cluster_id, snapshot.topic_id, part, off, topic))
    txids = []
    while (txn := coord.plan("kwords", f"r{len(txids)}")).planned_records:
        txids.append(txn.txid)
    # Out of order, one of them twice (a replay), committed in order.
    for t in [txids[-1], *txids[:-1], txids[0]]:
        submit(dsn, t)
    for t in txids:
        assert coord.commit("kwords", t).committed
    urls = Counter(v["url"] for _k, v in committed)
    urls[committed[2][1]["url"]] -= 1
    assert dict(query(dsn, "SELECT url, value FROM kurl_counts")) == urls
    assert sum(c["records_read"] for c in coord.commits("kwords")) == len(committed) + 5
    bad = dict(query(dsn, "SELECT event_id, reason FROM airflow_txn.quarantine WHERE committed"))
    assert len(bad) == 4 and all(e.startswith(f"{topic}:") for e in bad)
    assert sorted(bad.values()) == [RETRACTION_REFUSED.format("up:tw1"),
                                    "malformed record: not a JSON object of the schema",
                                    "the record has no value (a tombstone)", "the record's value is not UTF-8 text"]
    assert coord.status("kwords").lag == 0
    # The replay read what the first attempt read, by the digest both wrote -- the same the pure-Python
    # reader of those offsets makes.
    digests = query(dsn, "SELECT read_digest FROM airflow_txn.attempts WHERE topology_id = 'kwords' AND txid = %s "
                         "ORDER BY attempt", (txids[0],))
    batch = coord.transaction("kwords", txids[0]).batch
    python_read = list(KafkaSource(topic).read(None, "airflow_txn", "kwords", batch))  # type: ignore[arg-type]
    expected = read_digest(len(python_read), sum(zlib.crc32(r.offset.encode()) for r in python_read))
    every = [r for t in txids for r in KafkaSource(topic).read(None, "airflow_txn", "kwords",  # type: ignore[arg-type]
                                                               coord.transaction("kwords", t).batch)]
    # The pure-Python reader: the record as it is, saying what it retracts (its processor sets it aside).
    assert sorted((r.retracts, r.payload) for r in every if r.retracts) == [
        ("up:tw1", json.dumps(tweets(1)[0][1])), ("up:tw2", json.dumps(committed[2][1]))]
    assert digests == [(expected,), (expected,)]
    coord.close()


def test_the_broker_lost_under_a_read_and_back_costs_an_attempt_at_most(dsn: str, kafka: KafkaBroker,
                                                                         tmp_path: Path) -> None:
    """The broker SIGKILLed while the driver reads the batch, and started again on its ports and
    data two seconds later (what the chaos harness's ``kafka_kill_processing`` strikes): the attempt
    rides it out (the consumer retries) or fails; a retry then counts exactly the planned offsets."""
    from dev import faults

    topic = create_topic(kafka, 2)
    sent = tweets(30_000)
    for chunk in range(0, len(sent), 10_000):
        produce(kafka, topic, sent[chunk:chunk + 10_000])
    coord = Coordinator(dsn)
    coord.register(words(topic, max_batch_size=len(sent)))
    txn = coord.plan("kwords", "r0")
    assert txn.planned_records == len(sent)
    begun = tmp_path / "begun"
    jars = [str(p) for p in kafka_connector().fetch()]
    argv = ["spark-submit", "--master", "local[2]", *local_conf(), "--jars", ",".join(jars),
            "--py-files", provider_zip(), WORDS, "--topology", "kwords", "--txid", str(txn.txid)]
    env = faults.child_env({**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable, **startup_env()},
                           faults=f"spark.begin=waitfor:{begun}")
    job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not Path(f"{begun}.waiting").exists():
            assert job.poll() is None and time.monotonic() < deadline, "the driver never began its attempt"
            time.sleep(0.2)
        begun.touch()
        time.sleep(1.5)  # the batch's reading under way
        kafka.kill()
        time.sleep(2)
        kafka.start()
        out, _ = job.communicate(timeout=300)
    finally:
        job.kill()
        if kafka.proc is None or kafka.proc.poll() is not None:
            kafka.start()
    tries = 1
    if job.returncode != 0:  # the attempt failed; Airflow's retry is a new attempt of the same txid
        submit(dsn, txn.txid)
        tries = 2
    # The kill struck inside the read: the attempt failed, or its reader waited for the broker.
    assert tries == 2 or "could not be established" in out, out[-3000:]
    print(f"the batch committed after {tries} attempt(s)")
    assert coord.commit("kwords", txn.txid).committed, out[-3000:]
    assert dict(query(dsn, "SELECT url, value FROM kurl_counts")) == Counter(v["url"] for _k, v in sent)
    coord.close()


V2_READ = """
import json, sys
from pyspark.sql import SparkSession
from airflow_transactional import KafkaSource
from airflow_transactional.spark.kafka import read_kafka

topic, ranges = sys.argv[1], json.loads(sys.argv[2])
spark = SparkSession.builder.getOrCreate()
spark.conf.set("spark.sql.sources.useV1SourceList", "avro,Kafka,parquet")  # a user's own list
df = read_kafka(spark, KafkaSource(topic), {"topic": topic, "ranges": ranges}).df
rows = [list(r) for r in df.select("kafka_partition", "kafka_offset", "payload").collect()]
print(json.dumps({"plan": df._jdf.queryExecution().executedPlan().toString(), "rows": rows,
                  "v1": spark.conf.get("spark.sql.sources.useV1SourceList")}))
spark.stop()
"""


def test_the_kafka_reader_reads_through_the_connectors_v2_scan_and_keeps_the_users_v1_list(
        dsn: str, kafka: KafkaBroker, tmp_path: Path) -> None:
    """Spark reads a batch of ``kafka`` through its V1 relation by default, which turns every record's
    row into a Java ``Row`` and back; the provider's reader takes the connector's V2 batch scan."""
    topic = create_topic(kafka, 2)
    sent = [produce(kafka, topic, tweets(7 + 5 * p, start=100 * p), partition=p) for p in range(2)]
    job = tmp_path / "v2_read.py"
    job.write_text(V2_READ)
    res = spark_submit(dsn, str(job), topic, json.dumps([[p, 0, n] for p, n in enumerate(sent)]),
                       jars=[str(p) for p in kafka_connector().fetch()])
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert "BatchScan" in out["plan"] and "KafkaRelation" not in out["plan"], out["plan"]
    assert out["v1"] == "avro,parquet"
    assert sorted((p, o) for p, o, _ in out["rows"]) == [(p, o) for p, n in enumerate(sent) for o in range(n)]
    assert {json.loads(v)["url"] for _p, _o, v in out["rows"]} == {
        v["url"] for p in range(2) for _k, v in tweets(7 + 5 * p, start=100 * p)}


def test_kafka_options_map_librdkafka_settings_and_refuse_what_has_no_java_counterpart() -> None:
    from airflow_transactional.exceptions import ConfigError
    from airflow_transactional.spark.kafka import kafka_options

    options = kafka_options({"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL",
                             "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "ann", "sasl.password": 'p"w',
                             "ssl.ca.location": "/etc/ca.pem", "linger.ms": 5})
    assert options["kafka.bootstrap.servers"] == "b:9093"
    assert options["kafka.sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                                 'username="ann" password="p\\"w";')
    assert options["kafka.ssl.truststore.type"] == "PEM" and "kafka.linger.ms" not in options
    tuned = kafka_options({"bootstrap.servers": "b", "max.partition.fetch.bytes": 8 << 20, "fetch.wait.max.ms": 50,
                           "socket.receive.buffer.bytes": 1 << 20})
    assert tuned == {"kafka.bootstrap.servers": "b", "kafka.max.partition.fetch.bytes": str(8 << 20),
                     "kafka.fetch.max.wait.ms": "50", "kafka.receive.buffer.bytes": str(1 << 20)}
    with pytest.raises(ConfigError, match=r"\['ssl.keystore.password'\]") as refused:
        kafka_options({"bootstrap.servers": "b:9093", "ssl.keystore.password": "secret-value"})
    assert "secret-value" not in str(refused.value)
    assert json.dumps(kafka_options({"bootstrap.servers": "b"})) == '{"kafka.bootstrap.servers": "b"}'
