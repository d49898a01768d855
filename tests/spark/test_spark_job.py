"""The Spark helper under real ``spark-submit`` (local[2]): the ``words`` job processes planned
batches, the commit applies them, and the state equals an oracle computed straight from the
events appended (by event id). Bad records land in the quarantine; ``airflow-txn audit`` finds a
damaged state table, ``airflow-txn rebuild`` repairs it while commits continue, and the audit
then finds no difference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from airflow_transactional import EventLog, PostgresLogSource, SparkJob, StateSpec, TopologySpec
from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import NotProcessed, QuarantineOverLimit
from airflow_transactional.spark import cds as spark_cds
from tests.helpers import declared, query, spark_submit

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
WORDS = str(REPO / "spark_jobs" / "words.py")


def _spec(max_batch_size: int = 700) -> TopologySpec:
    return TopologySpec("words", PostgresLogSource("tweets"), [
        StateSpec("url_counts", {"url": "text"}, combiner="count"),
        StateSpec("domain_counts", {"domain": "text"}, combiner="count", kind="opaque"),
    ], max_batch_size=max_batch_size, max_in_flight=5,
        job=SparkJob(WORDS))


def _submit(dsn: str, *args: str, env: dict[str, str] | None = None,
            java_options: str | None = None) -> subprocess.CompletedProcess[str]:
    return spark_submit(dsn, WORDS, "--topology", "words", *args, env=env, java_options=java_options)


def _tweets(n: int) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        host = ["www.apache.org", "Spark.Apache.org", "example.com", "www.example.com"][i % 4]
        out.append((f"tw{i}", json.dumps({"url": f"https://{host}/p{i % 13}", "user": f"u{i % 5}"})))
    return out


def test_words_job_commits_exactly_what_the_log_holds_audit_agrees_and_rebuild_repairs(
        dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark_connect_conn: str) -> None:
    log = EventLog(dsn, "tweets")
    log.create(3)
    good = _tweets(2000)
    bad = [("bad-json", "{not json"), ("no-url", json.dumps({"user": "x"})), ("array", "[1, 2]")]
    log.append(good[:1000] + bad + good[1000:])
    assert log.append(good[:5]).duplicates == 5  # redelivery is dropped at the log
    coord = Coordinator(dsn)
    spec, dag_file = declared(tmp_path, _spec())
    coord.register(spec)
    txids = [coord.plan("words", f"run{k}").txid for k in range(3)]
    # Process out of order (txid 3 first, txid 2 twice: a replay), then commit in order.
    for t in (3, 1, 2, 2):
        res = _submit(dsn, "--txid", str(t))
        assert res.returncode == 0, res.stderr[-3000:]
    for t in txids:
        assert coord.commit("words", t).committed
    while (st := coord.status("words")).lag:
        t = coord.plan("words", f"more{st.committed_txid}").txid
        assert _submit(dsn, "--txid", str(t)).returncode == 0
        coord.commit("words", t)

    _counts_are_exact(dsn, good)
    # A damaged derived view: the audit finds it (its job a client of the tier's Spark Connect
    # server: the batches above and the rebuild below are the spark-submit story) ...
    query(dsn, "UPDATE url_counts SET value = value * 10 WHERE url LIKE '%p1%'")
    query(dsn, "DELETE FROM domain_counts WHERE domain = 'example.com'")
    query(dsn, "INSERT INTO url_counts VALUES ('https://bogus/', 5, 1)")
    on_connect = ["--spark-connect", spark_connect_conn]
    assert cli(["--dsn", dsn, "audit", "words", "--dag-file", dag_file, *on_connect]) == 1

    # ... and a rebuild recomputes it from the log while the topology keeps committing.
    outcome, seen, late = _rebuild_while_committing(dsn, log, coord, dag_file, tmp_path, monkeypatch)
    assert outcome == [0]
    urls = Counter(json.loads(p)["url"] for _e, p in good + late)
    assert seen and min(seen) >= len(urls)
    assert dict(query(dsn, "SELECT url, value FROM url_counts")) == urls
    assert query(dsn, "SELECT rebuild_from_txid FROM airflow_txn.topologies") == [(None,)]
    # The staged rows left are the delta history, rebased on what the rebuild recomputed: it adds up.
    assert dict(coord.state_as_of("words", "url_counts", coord.status("words").committed_txid)) == urls
    assert cli(["--dsn", dsn, "audit", "words", "--dag-file", dag_file, *on_connect]) == 0
    coord.close()
    log.close()


def test_the_demos_tweets_count_and_an_upstream_that_sends_ts_as_a_number_is_refused(dsn: str,
                                                                                     tmp_path: Path) -> None:
    """Regression: the demo's producers sent ``ts`` as a JSON number to a job that declares it
    ``string``, and every record was quarantined while the topology committed empty states. The
    demo's own producer now counts (its malformed rate quarantined, nothing else), and a batch
    quarantined whole is refused with the fix instead of committing nothing."""
    from dev.demo import Producer

    producer = Producer(dsn, tmp_path, rate=1, seed=7)
    demo = [producer.tweet(n) for n in range(400)]
    log = EventLog(dsn, "tweets")
    log.create(2)
    log.append(demo)
    coord = Coordinator(dsn)
    coord.register(_spec())
    first = coord.plan("words", "demo").txid
    assert _submit(dsn, "--txid", str(first)).returncode == 0
    assert coord.commit("words", first).committed
    counted = [json.loads(p)["url"] for _e, p in demo if p.startswith('{"url": "https')]
    assert dict(query(dsn, "SELECT url, value FROM url_counts")) == Counter(counted) and counted
    assert query(dsn, "SELECT count(*) FROM domain_counts")[0][0] > 0
    assert coord.status("words").quarantined == producer.malformed == len(demo) - len(counted)

    upstream = [(f"n{i}", json.dumps({"url": f"https://example.com/{i}", "user": "u", "ts": time.time()}))
                for i in range(60)]
    log.append(upstream)
    second = coord.plan("words", "upstream").txid
    assert _submit(dsn, "--txid", str(second)).returncode == 0
    with pytest.raises(QuarantineOverLimit, match=r"quarantined 60 of its 60 records \(100%\).* 60 x field 'ts' "
                                                  r"must be text \(the record schema declares it string\), got ….*"
                                                  r"the producer sends 'ts' as something other than text: declare "
                                                  r"it in the job's schema as what it sends \(e\.g\. 'ts double'\)"):
        coord.commit("words", second)
    assert coord.status("words").committed_txid == first
    coord.close()
    log.close()


def _counts_are_exact(dsn: str, good: list[tuple[str, str]]) -> None:
    """Every good event counted once per state; the bad ones quarantined; txid 2's replay won once."""
    urls = Counter(json.loads(p)["url"] for _e, p in good)
    assert dict(query(dsn, "SELECT url, value FROM url_counts")) == urls
    domains = Counter()
    for url, n in urls.items():
        host = url.split("/")[2].lower()
        domains[host[4:] if host.startswith("www.") else host] += n
    assert {k: int(v) for k, v in query(dsn, "SELECT domain, value FROM domain_counts")} == domains
    quarantined = query(dsn, "SELECT event_id, reason FROM airflow_txn.quarantine WHERE committed ORDER BY 1")
    assert [e for e, _r in quarantined] == ["array", "bad-json", "no-url"]
    assert "missing required field 'url'" in dict(quarantined)["no-url"]
    attempts = query(dsn, "SELECT txid, attempt, status FROM airflow_txn.attempts WHERE txid = 2 ORDER BY 2")
    assert attempts == [(2, 1, "discarded"), (2, 2, "committed")]  # the replay's output won, once



def _rebuild_while_committing(dsn: str, log: EventLog, coord: Coordinator, dag_file: str, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int], list[tuple[str, str]]]:
    """A rebuild whose job holds after loading its recomputation until released, a commit landing
    meanwhile, and a reader polling through the swap: (the CLI's exit, the row counts the reader
    saw, the events appended meanwhile)."""
    release = tmp_path / "release"
    monkeypatch.setenv("AIRFLOW_TXN_FAULTS", f"rebuild.loaded:words=waitfor:{release}")
    outcome: list[int] = []
    rebuild = ["--dsn", dsn, "rebuild", "words", "--dag-file", dag_file]
    worker = threading.Thread(target=lambda: outcome.append(cli(rebuild)))
    worker.start()
    rebuild_from = coord.status("words").committed_txid
    while query(dsn, "SELECT rebuild_from_txid FROM airflow_txn.topologies") != [(rebuild_from,)]:
        time.sleep(0.5)
    monkeypatch.delenv("AIRFLOW_TXN_FAULTS")
    late = _tweets(2300)[2000:]
    log.append(late)
    t = coord.plan("words", "during-rebuild").txid
    assert _submit(dsn, "--txid", str(t)).returncode == 0
    assert coord.commit("words", t).committed
    assert query(dsn, "SELECT count(*) FROM airflow_txn.stg_1_url_counts")[0][0] > 0  # the journal
    # A reader polling through the swap never sees a half-built view (the swap is one transaction).
    seen: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.append(query(dsn, "SELECT count(*) FROM url_counts")[0][0])

    reader = threading.Thread(target=read)
    reader.start()
    release.touch()
    worker.join(300)
    stop.set()
    reader.join(30)
    return outcome, seen, late


FAILING_JOB = """
import sys
import time
from pyspark.sql import functions as F
from airflow_transactional.spark_job import run

def transform(df):
    # url_counts stages fine; domain_counts then dies on the executors mid-write.
    return {"url_counts": df.select("url", F.lit(1).alias("value")),
            "domain_counts": df.select(F.lit("x").alias("domain"),
                                       F.raise_error(F.lit("executor lost")).cast("bigint").alias("value"))}

raise SystemExit(run(transform, schema="url string", argv=["--topology", "words", "--txid", sys.argv[1]]))
"""


def test_a_job_dying_mid_write_leaves_nothing_committable(dsn: str, tmp_path: Path) -> None:
    log = EventLog(dsn, "tweets")
    log.create(2)
    log.append(_tweets(300))
    coord = Coordinator(dsn)
    coord.register(_spec())
    t = coord.plan("words", "r1").txid
    job = tmp_path / "failing.py"
    job.write_text(FAILING_JOB)
    res = subprocess.run([sys.executable, str(job), str(t)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable})
    assert res.returncode != 0
    assert "executor lost" in res.stderr
    # Part of the output reached staging, but the attempt is failed: it can never be committed.
    assert query(dsn, "SELECT count(*) FROM airflow_txn.stg_1_url_counts")[0][0] > 0
    assert query(dsn, "SELECT status FROM airflow_txn.attempts") == [("failed",)]
    with pytest.raises(NotProcessed):
        coord.commit("words", t)
    assert coord.recover("words").staged_rows_deleted > 0
    assert query(dsn, "SELECT count(*) FROM airflow_txn.stg_1_url_counts") == [(0,)]
    # The next attempt processes the same batch and commits it once.
    assert _submit(dsn, "--txid", str(t)).returncode == 0
    assert coord.commit("words", t).attempt == 2
    assert sum(v for (v,) in query(dsn, "SELECT value FROM url_counts")) == 300
    coord.close()
    log.close()



def test_the_words_job_starts_from_the_class_data_sharing_archive(dsn: str, tmp_path: Path) -> None:
    # Under -Xshare:on a JVM refuses to start with an archive it cannot use: the job running at
    # all proves the archive fits this JVM and Spark; the class-load log shows it was used.
    startup = spark_cds.build()  # found at once when `make test` built it
    assert spark_cds.current() == startup
    log = EventLog(dsn, "tweets")
    log.create(2)
    good = _tweets(300)
    log.append([*good, ("bad-json", "{not json")])
    coord = Coordinator(dsn)
    coord.register(_spec())
    txid = coord.plan("words", "run0").txid
    loads = tmp_path / "class-load.log"
    res = _submit(dsn, "--txid", str(txid),
                  java_options=f"-Xshare:on -XX:SharedArchiveFile={startup.archive} -Xlog:class+load=info:file={loads}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert coord.commit("words", txid).committed
    assert dict(query(dsn, "SELECT url, value FROM url_counts")) == Counter(json.loads(p)["url"] for _e, p in good)
    lines = loads.read_text().splitlines()
    shared = sum(1 for line in lines if "source: shared objects file" in line)
    assert shared > 10_000 and shared > 0.6 * len(lines), (shared, len(lines))
