"""A state added to a running Spark topology (``core/evolution.py``) with the owner's CLI: the
``words`` job grows a third state, its rows dropped while it is only declared; ``airflow-txn evolve
--approve`` builds it from the log's history on the tier's Spark Connect server while a txid
commits, and switches it in; it then equals a count straight from the events appended, and every
commit after keeps it so. The batches run as Connect clients too: this is the build's story, not
spark-submit's."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from airflow_transactional import EventLog, PostgresLogSource, SparkJob, StateSpec, TopologySpec
from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from tests.helpers import connect_job, declared, query

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
WORDS = str(REPO / "spark_jobs" / "words.py")
USERS = StateSpec("user_counts", {"user": "text"}, combiner="count")
#: The words job once its DAG file adds ``user_counts``: the same transform, and each tweet's user.
GROWN_JOB = f"""
import sys
sys.path.insert(0, {str(REPO / "spark_jobs")!r})
from pyspark.sql import functions as F
from airflow_transactional.spark_job import per_record, run
from words import transform as words

def transform(tweets):
    return {{**words(tweets), "user_counts": per_record(tweets, {{"user": F.col("user")}})}}

if __name__ == "__main__":
    raise SystemExit(run(transform, schema="url string, user string, ts string", required=["url"]))
"""


def _spec(job: str, *extra: StateSpec) -> TopologySpec:
    return TopologySpec("words", PostgresLogSource("tweets"), [
        StateSpec("url_counts", {"url": "text"}, combiner="count"),
        StateSpec("domain_counts", {"domain": "text"}, combiner="count", kind="opaque"), *extra,
    ], max_batch_size=150, max_in_flight=5, job=SparkJob(job))


def _tweets(first: int, n: int) -> list[tuple[str, str]]:
    return [(f"tw{i}", json.dumps({"url": f"https://example.com/p{i % 13}", "user": f"u{i % 9}"}))
            for i in range(first, first + n)]


def _run(dsn: str, remote: str, coord: Coordinator, job: str, run_key: str) -> int:
    txid = coord.plan("words", run_key).txid
    done = connect_job(dsn, remote, job, "--topology", "words", "--txid", str(txid))
    assert done.returncode == 0, done.stderr[-3000:]
    assert coord.commit("words", txid).committed
    return txid


def _started(dsn: str, tmp_path: Path, remote: str, *, tweets: int, runs: int) -> tuple[EventLog, Coordinator]:
    """The words topology registered from its DAG file, ``tweets`` in its log, committed by ``runs`` runs."""
    log = EventLog(dsn, "tweets")
    log.create(3)
    log.append(_tweets(0, tweets))
    coord = Coordinator(dsn)
    spec, _dag = declared(tmp_path, _spec(WORDS))
    coord.register(spec)
    for n in range(runs):
        _run(dsn, remote, coord, WORDS, f"r{n + 1}")
    return log, coord


def test_a_state_added_to_the_words_job_is_built_from_history_and_kept_after_the_switch(
        dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark_remote: str,
        spark_connect_conn: str) -> None:
    log, coord = _started(dsn, tmp_path, spark_remote, tweets=300, runs=2)
    # The DAG file adds the state and the job returns its rows: declared, they are dropped.
    grown = tmp_path / "grown_words.py"
    grown.write_text(GROWN_JOB)
    spec, dag_file = declared(tmp_path, _spec(str(grown), USERS))
    coord.register(spec)
    log.append(_tweets(300, 100))
    _run(dsn, spark_remote, coord, str(grown), "r3")
    assert coord.evolution("words")["declared"] == ["user_counts"]
    assert query(dsn, "SELECT to_regclass('public.user_counts')") == [(None,)]

    # Approved: the build folds the history and holds until released; a txid commits meanwhile.
    release = tmp_path / "release"
    monkeypatch.setenv("AIRFLOW_TXN_FAULTS", f"build.loaded:words=waitfor:{release}")
    outcome: list[int] = []
    approve = ["--dsn", dsn, "evolve", "words", "--approve", "--dag-file", dag_file,
               "--spark-connect", spark_connect_conn]
    worker = threading.Thread(target=lambda: outcome.append(cli(approve)))
    worker.start()
    while coord.evolution("words")["building_through_txid"] is None:
        time.sleep(0.3)
    monkeypatch.delenv("AIRFLOW_TXN_FAULTS")
    log.append(_tweets(400, 120))
    during = _run(dsn, spark_remote, coord, str(grown), "during-build")
    assert query(dsn, "SELECT to_regclass('public.user_counts')") == [(None,)]  # not switched in yet
    release.touch()
    worker.join(300)
    assert outcome == [0]
    status = coord.evolution("words")
    assert status["built"] == {"user_counts": during - 1} and not status["building"]

    def users() -> dict[str, int]:
        return {u: int(n) for u, n in query(dsn, 'SELECT "user", value FROM user_counts')}

    everything = [p for _e, p in _tweets(0, 520)]
    assert users() == Counter(json.loads(p)["user"] for p in everything)  # every committed tweet, once
    log.append(_tweets(520, 60))
    _run(dsn, spark_remote, coord, str(grown), "after")
    everything = [p for _e, p in _tweets(0, 580)]
    assert users() == Counter(json.loads(p)["user"] for p in everything)
    assert cli(["--dsn", dsn, "audit", "words", "--dag-file", dag_file, "--spark-connect", spark_connect_conn]) == 0
    coord.close()
    log.close()


#: The words job once its DAG file redefines ``url_counts`` (version 2: per URL and user); until the
#: switch it returns the live version's rows as ``url_counts@1``.
REDEFINED_JOB = GROWN_JOB.replace(
    'return {**words(tweets), "user_counts": per_record(tweets, {"user": F.col("user")})}',
    'old = words(tweets)\n    return {**old, "url_counts@1": old["url_counts"], '
    '"url_counts": per_record(tweets, {"url": F.col("url"), "user": F.col("user")})}')
URLS_V2 = StateSpec("url_counts", {"url": "text", "user": "text"}, combiner="count", version=2)


def test_a_state_of_the_words_job_redefined_is_switched_in_and_its_old_version_archived(
        dsn: str, tmp_path: Path, spark_remote: str, spark_connect_conn: str) -> None:
    log, coord = _started(dsn, tmp_path, spark_remote, tweets=200, runs=1)
    job = tmp_path / "redefined_words.py"
    job.write_text(REDEFINED_JOB)
    assert '"url_counts@1"' in REDEFINED_JOB
    redefined = TopologySpec.from_config({**_spec(str(job)).to_config(), "states": [
        URLS_V2.to_config(), _spec(WORDS).to_config()["states"][1]]})
    spec, dag_file = declared(tmp_path, redefined)
    coord.register(spec)
    log.append(_tweets(200, 100))
    _run(dsn, spark_remote, coord, str(job), "r2")  # declared: the live version kept from url_counts@1
    assert cli(["--dsn", dsn, "evolve", "words", "--approve", "--dag-file", dag_file,
                "--spark-connect", spark_connect_conn]) == 0
    switched = coord.evolution("words")["built"]["url_counts"]
    log.append(_tweets(300, 50))
    _run(dsn, spark_remote, coord, str(job), "after")

    def counted(sql: str) -> Counter[tuple[str, ...]]:
        return Counter({tuple(row[:-1]): int(row[-1]) for row in query(dsn, sql)})

    tweets = [json.loads(p) for _e, p in _tweets(0, 350)]
    assert counted('SELECT url, "user", value FROM url_counts') == Counter((t["url"], t["user"]) for t in tweets)
    assert counted("SELECT url, value FROM url_counts_v1") == Counter((t["url"],) for t in tweets[:300])
    assert coord.evolution("words")["retired"] == {"url_counts__v1": switched}
    assert cli(["--dsn", dsn, "audit", "words", "--dag-file", dag_file, "--spark-connect", spark_connect_conn]) == 0
    coord.close()
    log.close()
