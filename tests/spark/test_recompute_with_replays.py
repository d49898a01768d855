"""A recomputation from the source knows what operators fixed and replayed: records quarantined
by the words job, edited by hand and replayed as a txid of their own stay counted through
``airflow-txn audit`` (no false difference) and ``airflow-txn rebuild`` (not silently dropped) --
and a key a correction set to 0 is no difference either.

Every job here is a client of the tier's Spark Connect server (``--spark-connect`` for the audits
and the rebuild): what is tested is what a recomputation counts, the same job code on either
backend; ``tests/spark/test_spark_job.py`` audits and rebuilds under ``spark-submit``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from airflow_transactional import EventLog
from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from tests.helpers import connect_job, declared, query
from tests.spark.test_spark_job import WORDS, _spec, _tweets

pytestmark = pytest.mark.spark


def test_a_rebuild_and_an_audit_keep_what_an_edited_replay_counted(dsn: str, tmp_path: Path, spark_remote: str,
                                                                  spark_connect_conn: str) -> None:
    def job(txid: int) -> int:
        return connect_job(dsn, spark_remote, WORDS, "--topology", "words", "--txid", str(txid)).returncode

    def recompute(command: str) -> int:
        return cli(["--dsn", dsn, command, "words", "--dag-file", dag_file, "--spark-connect", spark_connect_conn])

    log = EventLog(dsn, "tweets")
    log.create(1)
    good = _tweets(300)
    broken = [("fix-1", json.dumps({"user": "x", "link": "https://example.com/fixed"})),
              ("fix-2", json.dumps({"user": "y", "link": "https://example.com/fixed"}))]
    log.append(good + broken)
    coord = Coordinator(dsn)
    spec, dag_file = declared(tmp_path, _spec())
    coord.register(spec)
    t1 = coord.plan("words", "r1").txid
    assert job(t1) == 0
    assert coord.commit("words", t1).committed
    assert coord.status("words").quarantined == 2
    # The operator fixes both records by hand (the producer named the field `link`) and replays them.
    for record in coord.quarantined("words", t1):
        fixed = json.loads(record["record"])
        coord.edit_quarantined("words", record["id"], json.dumps({"user": fixed["user"], "url": fixed["link"]}))
    replay = coord.plan_replay("words", "replay", {"txids": f"{t1}..{t1}"}).txid
    assert job(replay) == 0
    assert coord.commit("words", replay).committed
    urls = Counter(json.loads(p)["url"] for _e, p in good) + Counter({"https://example.com/fixed": 2})
    assert dict(query(dsn, "SELECT url, value FROM url_counts")) == urls
    assert coord.status("words").quarantined == 0

    # The audit recomputes the source and the replay together: nothing differs.
    assert recompute("audit") == 0
    # A rebuild keeps the operator's fixes counted.
    assert recompute("rebuild") == 0
    assert dict(query(dsn, "SELECT url, value FROM url_counts")) == urls
    assert recompute("audit") == 0

    # A key at 0 (as a correction leaves the keys it takes back) is a key the recomputation never
    # saw: the same count, not a difference.
    query(dsn, "INSERT INTO url_counts VALUES ('https://gone.example/', 0, 1)")
    assert recompute("audit") == 0
    query(dsn, "UPDATE url_counts SET value = 1 WHERE url = 'https://gone.example/'")
    assert recompute("audit") == 1  # a count is still one
    coord.close()
    log.close()
