"""``airflow-txn verify --dag-file``: the topology's own Spark job recomputes committed txids, one
round at a time, and checks each against its commit's digests -- the mark follows the passing
txids, an event changed in the log after its commit fails its txid with the keys it moves, and the
command's exit code says so; ``airflow-txn audit`` starts from the verified mark where retention
took the input, and refuses, naming them, where txids lost it unverified. Every job here is a
client of the tier's Spark Connect server (``--spark-connect``); the verify task under
``spark-submit`` runs in the chaos tests' words topology."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional import EventLog
from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from tests.helpers import query
from tests.spark.test_correction_preview import cli_json, committed_words

pytestmark = pytest.mark.spark


def _verify(dsn: str, dag_file: str, capsys: Any, *flags: str) -> tuple[int, str]:
    capsys.readouterr()  # what the test logged before
    code = cli(["--dsn", dsn, "verify", "words", "--dag-file", dag_file, *flags])
    return code, capsys.readouterr().out


def _audit(dsn: str, dag_file: str, capsys: Any, conn: str) -> tuple[int, dict[str, Any]]:
    return cli_json(dsn, capsys, "audit", "words", "--dag-file", dag_file, "--spark-connect", conn)


def test_rounds_of_the_spark_job_verify_the_commits_and_the_audit_starts_where_they_did(
        dsn: str, tmp_path: Path, capsys: Any, spark_remote: str, spark_connect_conn: str) -> None:
    _job, dag_file, _urls = committed_words(dsn, spark_remote, tmp_path, 300, 100)
    with Coordinator(dsn) as coord:
        code, found = cli_json(dsn, capsys, "verify", "words", "--dag-file", dag_file, "--round", "2",
                               "--spark-connect", spark_connect_conn)
        assert code == 0 and found["verified_through"] == 2
        assert [(c["txid"], c["status"]) for c in found["round"]["checked"]] == [(1, "verified"), (2, "verified")]
        log = EventLog(dsn, "tweets")
        for p, lsn in coord.transaction("words", 2).end_offsets.items():  # retention takes txids 1 and 2's events
            log.truncate(int(p), int(lsn))
        code, clean = _audit(dsn, dag_file, capsys, spark_connect_conn)
        assert code == 0 and clean["auditable"] and clean["differences"] == 0, clean
        assert clean["from_verified_txid"] == 2  # txids 1..2 from their deltas, 3 recomputed from the log

        # An event txid 3 read is changed in the log after its commit: its check fails, naming the keys.
        [(event, payload)] = query(dsn, "SELECT event_id, payload FROM airflow_txn.log_events ORDER BY partition "
                                        "DESC, lsn DESC LIMIT 1")
        moved = json.loads(payload)["url"]
        query(dsn, "UPDATE airflow_txn.log_events SET payload = %s WHERE event_id = %s",
              (json.dumps({"url": "https://example.org/changed", "user": "u"}), event))
        code, out = _verify(dsn, dag_file, capsys, "--spark-connect", spark_connect_conn)
        assert code == 1
        assert "verified through txid 2 of 3 committed (failed 1, verified 2)" in out
        assert f"url_counts[{moved}]: committed " in out and "url_counts[https://example.org/changed]" in out
        [check] = [c for c in coord.verify_status("words")["checks"] if c["txid"] == 3]
        assert check["status"] == "failed" and set(check["detail"]["differences"]) == {"url_counts", "domain_counts"}
        assert query(dsn, "SELECT count(*) FROM airflow_txn.stg_1_url_counts WHERE attempt < 0") == [(0,)]
        # The audit, from txid 2, recomputes the changed event too.
        code, found = _audit(dsn, dag_file, capsys, spark_connect_conn)
        assert code == 1 and found["states"]["url_counts"]["differences"] == 2, found

        # Checks forgotten: nothing verified to start from, and the source no longer holds txids 1..2.
        assert coord.verify_recheck("words", 1, 2) == 0
        code, refused = _audit(dsn, dag_file, capsys, spark_connect_conn)
        assert code == 1 and not refused["auditable"] and "retention removed committed events" in refused["reason"]
        assert "txids 1..2 were not verified before their input was removed" in refused["reason"], refused
        log.close()
