"""Spark's side of a Kafka source: reading a planned batch by its offsets, and the connection's
librdkafka settings as the options of Spark's Kafka reader (a Java client)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError
from ..model import RETRACTS_HEADER, TopicBatch, planned_batch
from ..sources import KafkaSource, Source
from ..sources.kafka import RETRACTION_REFUSED
from .handoff import reader_options
from .read import EVENT_ID_COL, INVALID_COL, OFFSET_COL, TEXT, Records, raw_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrameReader, SparkSession

log = logging.getLogger(__name__)


def read_kafka(spark: SparkSession, source: Source, batch: Mapping[str, Any], *,
               retractions: frozenset[str] = frozenset(), **_: Any) -> Records:
    """A Kafka batch: exactly its offsets, by Spark's Kafka reader (``assign`` and per-partition
    start and end, ``read_committed``, ``failOnDataLoss``). A record's offset is ``partition:offset``
    and its id ``topic:partition:offset``; a record without a value, or whose value is not UTF-8
    text, is judged bad by :func:`.validate.prepare`, and so is a retraction of a correction (its
    header) that is not among ``retractions`` (those a publisher of the store put there, taken back
    by the batch); the record's topic, partition, offset, key, timestamp and headers go to the
    transform as the ``kafka_*`` columns."""
    from pyspark.sql import functions as F

    if not isinstance(source, KafkaSource):
        raise ConfigError(f"the Kafka reader got a {source.kind!r} source")
    batch = planned_batch(batch, source.kind)
    if not isinstance(batch, TopicBatch) or not (ranges := [r for r in batch.ranges if r.end > r.start]):
        return Records(spark.createDataFrame([], raw_schema()), TEXT)
    topic = batch.topic
    # Spark's redaction hides options by name: the JAAS line carries a password in its value.
    spark.conf.set("spark.sql.redaction.options.regex", "(?i)url|jaas|password|secret|key\\.password")
    df = (batch_reader(spark, topic, ranges).options(**reader_options(spark, kafka_options(source.config())))
          .option("includeHeaders", "true").load())
    offset = F.concat_ws(":", F.col("partition").cast("string"), F.col("offset").cast("string"))
    retracts = F.get(F.filter(F.col("headers"), lambda h: h["key"] == RETRACTS_HEADER), 0)["value"].cast("string")
    unknown = retracts.isNotNull() & (~offset.isin(sorted(retractions)) if retractions else F.lit(True))
    invalid = (F.when(F.col("value").isNull(), F.lit("the record has no value (a tombstone)"))
               .when(~F.is_valid_utf8(F.col("value")), F.lit("the record's value is not UTF-8 text"))
               .when(unknown, F.format_string(RETRACTION_REFUSED.replace("{}", "%s"), retracts)))
    return Records(df.select(
        offset.alias(OFFSET_COL),
        F.concat_ws(":", F.col("topic"), F.col("partition").cast("string"), F.col("offset").cast("string"))
        .alias(EVENT_ID_COL),
        F.when(invalid.isNull(), F.col("value").cast("string")).alias("payload"),
        invalid.alias(INVALID_COL),
        F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"), F.col("key").alias("kafka_key"),
        F.col("timestamp").alias("kafka_timestamp"), F.col("headers").alias("kafka_headers")), TEXT)


def batch_reader(spark: SparkSession, topic: str, ranges: Sequence[tuple[int, int, int]]) -> DataFrameReader:
    """Spark's Kafka reader over exactly ``ranges`` (partition, start, end) of ``topic``: the
    partitions assigned, each from its start to its end, ``read_committed``, and a range the broker
    no longer has an error (``failOnDataLoss``); the connection's options go on top.

    Read by the connector's DataSource V2 batch reader: Spark lists ``kafka`` among the sources a
    batch read takes through V1 (``spark.sql.sources.useV1SourceList``), whose relation turns each
    record's row into a Java ``Row`` and back (``python -m bench.kafka_read`` measures both)."""
    use_v2_reader(spark)
    return (spark.read.format("kafka")
            .option("assign", json.dumps({topic: [p for p, _lo, _hi in ranges]}))
            .option("startingOffsets", json.dumps({topic: {str(p): lo for p, lo, _hi in ranges}}))
            .option("endingOffsets", json.dumps({topic: {str(p): hi for p, _lo, hi in ranges}}))
            .option("kafka.isolation.level", "read_committed").option("failOnDataLoss", "true"))


#: The session setting that lists the sources a batch read takes through DataSource V1, and
#: Spark's own default of it (4.2).
V1_LIST, V1_SOURCES = "spark.sql.sources.useV1SourceList", "avro,csv,json,kafka,orc,parquet,text"


def use_v2_reader(spark: SparkSession) -> None:
    """Take ``kafka`` off the session's list of sources read through DataSource V1 (the rest kept)."""
    listed = [s.strip() for s in str(spark.conf.get(V1_LIST, V1_SOURCES)).split(",") if s.strip()]
    if any(s.lower() == "kafka" for s in listed):
        spark.conf.set(V1_LIST, ",".join(s for s in listed if s.lower() != "kafka"))


#: librdkafka settings (a ``kafka`` connection's extra) that mean the same to Spark's Java client.
KAFKA_SAME = ("bootstrap.servers", "security.protocol", "client.id", "ssl.endpoint.identification.algorithm",
              "request.timeout.ms", "reconnect.backoff.ms", "retry.backoff.ms", "metadata.max.age.ms",
              "fetch.min.bytes", "fetch.max.bytes", "max.partition.fetch.bytes")
#: librdkafka settings the Java client names otherwise: how long a fetch waits, the socket's buffer.
KAFKA_RENAMED = {"fetch.wait.max.ms": "fetch.max.wait.ms", "socket.receive.buffer.bytes": "receive.buffer.bytes"}
#: The JAAS login module of each SASL mechanism a username and password log in with.
SASL_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def kafka_options(config: Mapping[str, Any]) -> dict[str, str]:
    """Spark's ``kafka.*`` options for a connection's librdkafka settings, through an explicit
    allow-list: settings named alike pass as they are (the two the Java client names otherwise,
    renamed), a SASL username and password become the JAAS line, a CA file a PEM truststore; a
    setting with no Java counterpart is refused by name (never its value) when it would change how
    the broker is reached, and left out otherwise."""
    options: dict[str, str] = {}
    rest = dict(config)
    for key in KAFKA_SAME:
        if key in rest:
            options[f"kafka.{key}"] = str(rest.pop(key))
    for key, java in KAFKA_RENAMED.items():
        if key in rest:
            options[f"kafka.{java}"] = str(rest.pop(key))
    if options.get("kafka.ssl.endpoint.identification.algorithm") == "none":
        options["kafka.ssl.endpoint.identification.algorithm"] = ""
    mechanism = rest.pop("sasl.mechanism", None) or rest.pop("sasl.mechanisms", None)
    user, password = rest.pop("sasl.username", None), rest.pop("sasl.password", None)
    if mechanism:
        options["kafka.sasl.mechanism"] = str(mechanism)
    if user is not None or password is not None:
        module = SASL_MODULES.get(str(mechanism or "PLAIN").upper())
        if module is None:
            raise ConfigError(f"SASL mechanism {mechanism!r} with a username and password has no Java login module "
                              f"here: use one of {', '.join(SASL_MODULES)}")
        quoted = [str(v).replace("\\", "\\\\").replace('"', '\\"') for v in (user or "", password or "")]
        options["kafka.sasl.jaas.config"] = f'{module} required username="{quoted[0]}" password="{quoted[1]}";'
    if "ssl.ca.location" in rest:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = str(rest.pop("ssl.ca.location"))
    refused = sorted(k for k in rest if k.startswith(("sasl.", "ssl.", "oauthbearer")))
    if refused:
        raise ConfigError(f"Kafka settings {refused} have no counterpart Spark's Kafka reader takes here: give the "
                          "cluster's truststore and keystore by path (ssl.ca.location) and SASL by sasl.username / "
                          "sasl.password, or read with a Kafka client of the cluster's own configuration")
    if rest:
        log.info("Kafka settings left out of Spark's reader (librdkafka only): %s", ", ".join(sorted(rest)))
    return options
