"""A source kind is one class, registered by being defined: what the provider asks of a kind --
its Spark reader, its jobs' connectors, its lineage dataset, whether its records replay as text,
whether a batch may read fewer records than planned -- it asks the class, never the kind's name."""

from __future__ import annotations

from typing import ClassVar

import pytest

from airflow_transactional import KafkaSource, LandingDirectory, PostgresLogSource
from airflow_transactional.connections import Connections
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.sources import ObjectLanding, Source, source_from_config
from airflow_transactional.spark.jars import CONNECTORS
from airflow_transactional.spark.read import reader_of

pytestmark = pytest.mark.unit

KAFKA = Connections(lambda conn_id: {"bootstrap.servers": "SSL://b1.example:9093,b2.example:9093"})
EXAMPLES = [PostgresLogSource("tweets"), LandingDirectory("/data/in"), LandingDirectory("/data/in", format="parquet"),
            LandingDirectory("s3a://bucket/in", conn_id="aws_x"), LandingDirectory("hdfs://nn:8020/landing"),
            KafkaSource("tweets", connections=KAFKA)]


def test_each_kind_is_registered_once_by_its_class() -> None:
    assert Source.kinds == {"postgres_log": PostgresLogSource, "landing": LandingDirectory, "kafka": KafkaSource}
    with pytest.raises(ConfigError, match="unknown source kind 'ftp': use one of kafka, landing, postgres_log"):
        source_from_config({"kind": "ftp", "path": "/x"})


@pytest.mark.parametrize("source", EXAMPLES, ids=lambda s: s.to_config()["kind"] + ":" + s.to_config().get("path", ""))
def test_each_source_is_rebuilt_from_its_stored_form_and_names_its_own_spark_reader(source: Source) -> None:
    again = source_from_config(source.to_config())
    assert again == source and type(again) is type(source)
    assert callable(reader_of(source))
    assert set(source.spark_connectors()) <= set(CONNECTORS)


def test_what_the_provider_asks_of_a_kind_the_class_answers() -> None:
    assert [type(s) for s in EXAMPLES[3:5]] == [ObjectLanding, ObjectLanding]
    assert [s.spark_connectors() for s in EXAMPLES] == [(), (), (), ("s3a",), (), ("kafka",)]
    assert [s.records_are_text() for s in EXAMPLES] == [True, True, False, True, True, True]
    assert [s.reads_fewer_than_planned for s in EXAMPLES] == [False] * 5 + [True]
    assert [s.dataset("db", "airflow_txn") for s in EXAMPLES] == [
        ("postgres", "db.airflow_txn.log.tweets"), ("file", "/data/in"), ("file", "/data/in"),
        ("s3://bucket", "in"), ("hdfs://nn:8020", "/landing"), ("kafka://b1.example:9093", "tweets")]


def test_a_new_kind_registers_itself_and_a_reader_it_cannot_name_is_refused_with_the_fix() -> None:
    class Ftp(LandingDirectory):
        kind: ClassVar[str] = "ftp_test"
        spark_reader: ClassVar[str] = "no_such_module.read"

    try:
        assert Source.kinds["ftp_test"] is Ftp
        assert type(source_from_config({"kind": "ftp_test", "path": "/x"})) is Ftp
        with pytest.raises(ConfigError, match=r"set spark_reader on the source's class to 'package\.module\.function'"):
            reader_of(Ftp("/x"))
    finally:
        del Source.kinds["ftp_test"]
