"""The words job reading a landing directory on a real S3 server (s3a, the jars ``make jars``
fetched) and on a real HDFS (Spark's own HDFS client), under spark-submit: exactly the planned
versions, replayed and out of order, committed in order -- the numbers those of the files the
producer uploaded, bad lines quarantined; a file replaced under its plan fails the attempt naming
it, and is counted later as the new version it is."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional import LandingDirectory, SparkJob, StateSpec, TopologySpec
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.spark.jars import s3a_connector
from tests.helpers import query, spark_submit

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
WORDS = str(REPO / "spark_jobs" / "words.py")
HOSTS = ["www.apache.org", "Spark.Apache.org", "example.com"]


def _lines(start: int, n: int) -> list[str]:
    return [json.dumps({"url": f"https://{HOSTS[i % 3]}/p{i % 7}", "user": f"u{i % 4}"})
            for i in range(start, start + n)]


class Store:
    def __init__(self, kind: str, server: Any) -> None:
        self.kind, self.server = kind, server
        name = f"w{uuid.uuid4().hex[:10]}"
        if kind == "s3":
            server.create_bucket(name)
            self.bucket, self.url, self.conn_id = name, f"s3a://{name}/in", None
        else:
            self.dir, self.conn_id = f"/{name}/in", "webhdfs_test"
            server.mkdirs(self.dir)
            self.url = f"{server.url}{self.dir}"

    def put(self, name: str, lines: list[str]) -> None:
        data = "".join(line + "\n" for line in lines).encode()
        if self.kind == "s3":
            self.server.client().put_object(Bucket=self.bucket, Key=f"in/{name}", Body=data)
        else:
            self.server.put(f"{self.dir}/{name}", data)

    def jars(self) -> list[str]:
        return [str(p) for p in s3a_connector().fetch()] if self.kind == "s3" else []


@pytest.fixture(params=["s3", "hdfs"])
def store(request: pytest.FixtureRequest) -> Store:
    return Store(request.param, request.getfixturevalue(request.param))


def _submit(dsn: str, store: Store, txid: int) -> Any:
    return spark_submit(dsn, WORDS, "--topology", "owords", "--txid", str(txid), jars=store.jars())


def test_the_words_job_reads_exactly_the_planned_versions_of_a_store(dsn: str, store: Store) -> None:
    good: list[str] = []
    names = ["a.json", "b c.json", "d%e.json", "f[1].json"]  # a space, a percent sign, a glob's brackets
    for k, name in enumerate(names):
        lines = _lines(100 * k, 100)
        good += lines
        store.put(name, [*lines[:50], "{not json", *lines[50:]] if k == 1 else lines)
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
    store.put("g.json", _lines(900, 10))
    t3 = coord.plan("owords", "r3").txid
    store.put("g.json", _lines(950, 20))
    res = _submit(dsn, store, t3)
    said = res.stdout + res.stderr
    assert res.returncode != 0 and "g.json" in said and "opaque=True" in said, said[-3000:]
    coord.close()
