"""The words job reading a landing directory on a real S3 server (s3a, the jars ``make jars``
fetched) and on a real HDFS (Spark's own HDFS client), under spark-submit: exactly the planned
versions, replayed and out of order, committed in order -- the numbers those of the files the
producer uploaded, bad lines quarantined; a file replaced under its plan fails the attempt naming
it, and is counted later as the new version it is; the store lost under a read and back costs an
attempt at most."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional import LandingDirectory, SparkJob, StateSpec, TopologySpec
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.spark.submit import provider_zip
from tests.helpers import local_conf, query, spark_submit, startup_env
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
    return _submit_as(dsn, store, txid, "owords")


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


def test_on_a_bucket_that_keeps_versions_an_overwritten_planned_version_is_read_by_its_id(
        dsn: str, s3v: Any) -> None:
    # S3Mock, versioning enabled: a.json is overwritten after txid 1 planned it. The driver reads the
    # planned version by its id (the name holds another), b.json goes to Spark's reader by name, and
    # the new version of a.json is counted by txid 2.
    store = Place("s3", s3v)
    first, b, second = _lines(0, 60), _lines(60, 40), _lines(100, 30)
    store.put_lines("a.json", first)
    store.put_lines("b.json", b)
    coord = Coordinator(dsn)
    coord.register(TopologySpec("vwords", LandingDirectory(store.url, settle_seconds=0), [
        StateSpec("url_counts", {"url": "text"}, combiner="count", table="vurl_counts"),
        StateSpec("domain_counts", {"domain": "text"}, combiner="count", kind="opaque", table="vdomain_counts"),
    ], job=SparkJob(WORDS)))
    t1 = coord.plan("vwords", "r1").txid
    store.put_lines("a.json", second)
    res = _submit_as(dsn, store, t1, "vwords")
    assert res.returncode == 0, res.stdout[-3000:]
    assert coord.commit("vwords", t1).committed
    t2 = coord.plan("vwords", "r2")
    assert [f["path"].rsplit("/", 1)[1] for f in t2.batch["files"]] == ["a.json"]
    res = _submit_as(dsn, store, t2.txid, "vwords")
    assert res.returncode == 0, res.stdout[-3000:]
    assert coord.commit("vwords", t2.txid).committed
    assert dict(query(dsn, "SELECT url, value FROM vurl_counts")) == Counter(
        json.loads(x)["url"] for x in first + b + second)
    coord.close()


def test_the_store_lost_under_a_read_and_back_costs_an_attempt_at_most(
        dsn: str, store: Place, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The S3 server (SIGKILL) or the HDFS cluster -- its NameNode and DataNode, one JVM -- lost while
    # the driver reads the batch, and started again on its ports and data two seconds later. The
    # attempt either rides it out (s3a and the HDFS client retry) or fails; a retry then counts
    # exactly the planned versions, once.
    from airflow_transactional import limits

    # Files past the plan's read-through cap (here 500 kB, for files of 1 MB): registered by their
    # version alone, read as text by Spark, each line judged.
    monkeypatch.setattr(limits, "SCAN_MAX_BYTES", 500_000)
    oracle: Counter[str] = Counter()
    for k in range(4):
        lines = _lines(10_000 * k, 20_000)
        store.put_lines(f"big{k}.json", lines)
        oracle.update(json.loads(x)["url"] for x in lines)
    coord = Coordinator(dsn)
    coord.register(TopologySpec("lwords", LandingDirectory(store.url, settle_seconds=0, conn_id=store.conn_id), [
        StateSpec("url_counts", {"url": "text"}, combiner="count", table="lurl_counts"),
        StateSpec("domain_counts", {"domain": "text"}, combiner="count", kind="opaque", table="ldomain_counts"),
    ], job=SparkJob(WORDS)))
    txn = coord.plan("lwords", "r1")
    assert [(f["plain"], f["sha256"]) for f in txn.batch["files"]] == [(None, None)] * 4, txn.batch
    t = txn.txid
    begun = tmp_path / "begun"
    link = store.server.link if store.kind == "s3" else None
    job = _held_driver(dsn, store, t, begun)
    try:
        deadline = time.monotonic() + 180
        while not Path(f"{begun}.waiting").exists():
            assert job.poll() is None and time.monotonic() < deadline, "the driver never began its attempt"
            time.sleep(0.2)
        held = link.held if link is not None else 0
        if link is not None:
            link.slow(120, (2.0, 2.0))  # every object read held two seconds: the kill lands inside one
        begun.touch()
        while link is not None and link.held == held:
            assert job.poll() is None and time.monotonic() < deadline, "the driver never read an object"
            time.sleep(0.1)
        time.sleep(1.0 if link is not None else 4.0)  # HDFS: the reading under way
        store.server.kill()
        time.sleep(2)
        store.server.start()
        if link is not None:
            link.slow(0)
        out, _ = job.communicate(timeout=300)
    finally:
        job.kill()
    tries = 1
    if job.returncode != 0:  # the attempt failed; Airflow's retry is a new attempt of the same txid
        res = _submit_as(dsn, store, t, "lwords")
        assert res.returncode == 0, (out[-2000:], res.stdout[-3000:])
        tries = 2
        # What the failed attempt recorded says what failed, not the top of a Java stack.
        ((error,),) = query(dsn, "SELECT error FROM airflow_txn.attempts WHERE topology_id = 'lwords' AND attempt = 1")
        first = error.splitlines()[0]  # the store's: no HTTP response (S3), end of stream (HDFS), ...
        assert re.match(r"Py4JJavaError, caused by [\w.$]+(Exception|Error)\b", first) and re.search(
            r"(?i)http|eof|connect|refused|reset|closed|broken pipe|respond|timed out", first), error[:600]
    print(f"{store.kind}: the batch committed after {tries} attempt(s)")
    assert coord.commit("lwords", t).committed
    assert dict(query(dsn, "SELECT url, value FROM lurl_counts")) == oracle
    coord.close()


def _held_driver(dsn: str, store: Place, txid: int, begun: Path) -> subprocess.Popen[str]:
    """The words job of ``lwords`` under spark-submit, its driver held at the start of its attempt
    until ``begun`` exists (it writes ``begun.waiting`` once it waits)."""
    from dev import faults

    jars = store.jars()
    argv = ["spark-submit", "--master", "local[2]", *local_conf(), *(["--jars", ",".join(jars)] if jars else []),
            "--py-files", provider_zip(), WORDS, "--topology", "lwords", "--txid", str(txid)]
    env = faults.child_env({**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable, **startup_env()},
                           faults=f"spark.begin=waitfor:{begun}")
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _submit_as(dsn: str, store: Place, txid: int, topology: str) -> Any:
    return spark_submit(dsn, WORDS, "--topology", topology, "--txid", str(txid), jars=store.jars())


def test_a_corrupt_parquet_file_on_a_store_is_quarantined_by_name(dsn: str, store: Place) -> None:
    # A Parquet file cut short (a partial upload: no footer) or not Parquet at all would fail every
    # attempt of its txid; its footer is checked from three ranged reads of its planned version,
    # and it is quarantined by name while the rest of the batch commits.
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    urls = [f"https://{HOSTS[i % 3]}/p{i % 7}" for i in range(300)]
    buf = io.BytesIO()
    pq.write_table(pa.table({"url": urls, "user": [f"u{i % 4}" for i in range(300)]}), buf)
    store.put_bytes("a.parquet", buf.getvalue())
    store.put_bytes("b.parquet", buf.getvalue()[:-100])
    store.put_bytes("c.parquet", b"not a parquet file at all\n")
    coord = Coordinator(dsn)
    coord.register(TopologySpec("pwords", LandingDirectory(store.url, format="parquet", settle_seconds=0,
                                                           conn_id=store.conn_id), [
        StateSpec("url_counts", {"url": "text"}, combiner="count", table="purl_counts"),
        StateSpec("domain_counts", {"domain": "text"}, combiner="count", kind="opaque", table="pdomain_counts"),
    ], job=SparkJob(WORDS)))
    t = coord.plan("pwords", "r1").txid
    res = _submit_as(dsn, store, t, "pwords")
    assert res.returncode == 0, res.stdout[-3000:]
    assert coord.commit("pwords", t).committed
    assert dict(query(dsn, "SELECT url, value FROM purl_counts")) == Counter(urls)
    quarantined = sorted(query(dsn, "SELECT source_offset, reason FROM airflow_txn.quarantine WHERE committed"))
    assert [(o, r.split(" (")[0]) for o, r in quarantined] == [
        (f"{store.url}/b.parquet", "unreadable Parquet file: no footer at its end"),
        (f"{store.url}/c.parquet", "unreadable Parquet file: it does not begin with PAR1")], quarantined
    coord.close()


READ_AND_COUNT = """
import os, sys
from pyspark.sql import SparkSession
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.spark.read import read_landing
coord = Coordinator(os.environ["AIRFLOW_TXN_DSN"])
spark = SparkSession.builder.remote(os.environ["SPARK_REMOTE"]).getOrCreate()
records = read_landing(spark, coord.spec(sys.argv[1]).source, coord.transaction(sys.argv[1], int(sys.argv[2])).batch,
                       record_schema="url string, user string, ts string")
print(records.df.count())
"""


def test_on_spark_connect_no_read_carries_the_stores_credentials(dsn: str, s3: Any, tmp_path: Path) -> None:
    """Regression: a read on Spark Connect carried s3a's access key and secret as options, and the
    server posted them -- every value in clear -- to its UI (``/connect/``) and its event log. A
    read there now carries none; the server reads with the credentials it holds."""
    import urllib.request

    from dev.embedded import free_port
    from dev.sparkconnect import ConnectServer

    place = Place("s3", s3)
    lines = _lines(0, 40)
    place.put_lines("a.json", lines)
    events, ui = tmp_path / "events", free_port()
    events.mkdir()
    server = ConnectServer(free_port(), tmp_path / "connect.log", jars=place.jars(),
                           conf={"spark.ui.enabled": "true", "spark.ui.port": str(ui), "spark.eventLog.enabled": "true",
                                 "spark.eventLog.dir": str(events), "spark.eventLog.compress": "false"},
                           credentials=s3.server_credentials()).start()
    try:
        server.wait(120)
        coord = Coordinator(dsn)
        coord.register(TopologySpec("cwords", LandingDirectory(place.url, settle_seconds=0), [
            StateSpec("url_counts", {"url": "text"}, combiner="count", table="curl_counts"),
            StateSpec("domain_counts", {"domain": "text"}, combiner="count", table="cdomain_counts")]))
        txid = coord.plan("cwords", "r1").txid
        res = subprocess.run([sys.executable, WORDS, "--topology", "cwords", "--txid", str(txid)],
                             env={**os.environ, "AIRFLOW_TXN_DSN": dsn, "SPARK_REMOTE": server.url},
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert coord.commit("cwords", txid).committed
        assert dict(query(dsn, "SELECT url, value FROM curl_counts")) == Counter(json.loads(x)["url"] for x in lines)
        # The provider's reader of the batch, counted straight away: a plan shallow enough for the
        # server to show its read, options and all.
        counted = subprocess.run([sys.executable, "-c", READ_AND_COUNT, "cwords", str(txid)],
                                 env={**os.environ, "AIRFLOW_TXN_DSN": dsn, "SPARK_REMOTE": server.url},
                                 capture_output=True, text=True, timeout=300)
        assert counted.returncode == 0 and counted.stdout.split()[-1] == str(len(lines)), counted.stderr[-3000:]
        coord.close()
        base = f"http://127.0.0.1:{ui}"
        pages = [urllib.request.urlopen(f"{base}/connect/", timeout=30).read().decode()]
        for link in sorted(set(re.findall(r"/connect/(?:session|statement)/\?id=[^\"'&]+", pages[0]))):
            pages.append(urllib.request.urlopen(base + link, timeout=30).read().decode())
    finally:
        server.stop()
    shown = "".join(pages) + "".join(p.read_text(errors="replace") for p in events.rglob("*") if p.is_file())
    assert "s3a://" in shown  # the plans are there ...
    assert s3.credential not in shown and s3.identity not in shown  # ... and no credential in them
