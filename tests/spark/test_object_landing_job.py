"""The words job reading a landing directory on a real S3 server (s3a, the jars ``make jars``
fetched) and on a real HDFS (Spark's own HDFS client), under spark-submit: exactly the planned
versions, replayed and out of order, committed in order -- the numbers those of the files the
producer uploaded, bad lines quarantined; a file replaced under its plan fails the attempt naming
it, and is counted later as the new version it is."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional import LandingDirectory, SparkJob, StateSpec, TopologySpec
from airflow_transactional.coordinator import Coordinator
from tests.helpers import query, spark_submit
from tests.object_stores import Place

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
WORDS = str(REPO / "spark_jobs" / "words.py")
HOSTS = ["www.apache.org", "Spark.Apache.org", "example.com"]


def _lines(start: int, n: int) -> list[str]:
    return [json.dumps({"url": f"https://{HOSTS[i % 3]}/p{i % 7}", "user": f"u{i % 4}"})
            for i in range(start, start + n)]


@pytest.fixture(params=["s3", "hdfs"])
def store(request: pytest.FixtureRequest) -> Place:
    return Place(request.param, request.getfixturevalue(request.param))


def _submit(dsn: str, store: Place, txid: int) -> Any:
    return spark_submit(dsn, WORDS, "--topology", "owords", "--txid", str(txid), jars=store.jars())


def test_the_words_job_reads_exactly_the_planned_versions_of_a_store(dsn: str, store: Place) -> None:
    good: list[str] = []
    names = ["a.json", "b c.json", "d%e.json", "f[1].json"]  # a space, a percent sign, a glob's brackets
    for k, name in enumerate(names):
        lines = _lines(100 * k, 100)
        good += lines
        store.put_lines(name, [*lines[:50], "{not json", *lines[50:]] if k == 1 else lines)
    coord = Coordinator(dsn)
    coord.register(TopologySpec("owords", LandingDirectory(store.url, settle_seconds=0, conn_id=store.conn_id,
                                                           max_files=2), [
        StateSpec("url_counts", {"url": "text"}, combiner="count", table="ourl_counts"),
        StateSpec("domain_counts", {"domain": "text"}, combiner="count", kind="opaque", table="odomain_counts"),
    ], max_in_flight=5, job=SparkJob(WORDS)))
    t1, t2 = (coord.plan("owords", f"r{k}").txid for k in range(2))
    for t in (t2, t1, t1):  # out of order, and txid 1 replayed
        res = _submit(dsn, store, t)
        assert res.returncode == 0, res.stdout[-3000:]
    for t in (t1, t2):
        assert coord.commit("owords", t).committed
    assert dict(query(dsn, "SELECT url, value FROM ourl_counts")) == Counter(json.loads(x)["url"] for x in good)
    # The bad line is quarantined under the very name planned (not Hadoop's %-spelling of it).
    assert [o for (o,) in query(dsn, "SELECT source_offset FROM airflow_txn.quarantine WHERE committed")] \
        == [f"{store.url}/b c.json"]

    # A planned file replaced before its txid is processed: the attempt fails, naming it.
    store.put_lines("g.json", _lines(900, 10))
    t3 = coord.plan("owords", "r3").txid
    store.put_lines("g.json", _lines(950, 20))
    res = _submit(dsn, store, t3)
    said = res.stdout + res.stderr
    assert res.returncode != 0 and "g.json" in said and "opaque=True" in said, said[-3000:]
    coord.close()


def test_a_planned_name_is_spelled_as_hadoop_spells_it() -> None:
    """``uri_text`` is what maps ``input_file_name()`` back to the planned name: it must agree with
    Hadoop's own ``Path.toUri().toString()`` for every kind of character a key may hold."""
    from pyspark.sql import SparkSession

    from airflow_transactional.spark.pinned import uri_text

    names = ["a.json", "b c.json", "d%e.json", "f[1].json", "g+h.json", "é ü.json", "x#y?.json", "日本.json",
             'q{r}`^|"<>.json', "semi;colon=,&$@!~'()*.json", "tab\tand\u00a0nbsp.json", "emoji-\U0001f600.json"]
    spark = SparkSession.builder.master("local[1]").appName("uri-text").getOrCreate()
    try:
        path: Any = spark._jvm.org.apache.hadoop.fs.Path  # type: ignore[union-attr]
        for scheme in ("s3a://bucket/in/", "hdfs://127.0.0.1:8020/landing/"):
            for name in names:
                assert uri_text(scheme + name) == str(path(scheme + name).toUri().toString()), name
    finally:
        spark.stop()
