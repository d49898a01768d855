"""``airflow-txn correct A..B --dag-file``: the topology's own Spark job recomputes committed txids
and says what a correction would change, committing nothing; under the code the txids were
committed with it is the determinism check (``--check``), and after the job changed it names the
keys the change moves. Every job here is a client of the tier's Spark Connect server
(``--spark-connect``): what a preview says is the subject, the same job code under either
backend."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional import EventLog, PostgresLogSource, SparkJob, StateSpec, TopologySpec
from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from tests.helpers import connect_job, declared, query

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


def committed_words(dsn: str, remote: str, tmp_path: Path, records: int,
                    per_batch: int) -> tuple[Path, str, list[str]]:
    """The words job (a copy of it, to change) over ``records`` tweets, committed ``per_batch`` a
    txid by the job as a client of the Spark Connect server ``remote``: (the job, its DAG file, the
    tweets' URLs)."""
    job = tmp_path / "words.py"
    shutil.copy(REPO / "spark_jobs" / "words.py", job)
    log = EventLog(dsn, "tweets")
    log.create(2)
    urls = [f"https://{['www.apache.org', 'example.com'][i % 2]}/p{i % 5}" for i in range(records)]
    log.append([(f"tw{i}", json.dumps({"url": u, "user": "u"})) for i, u in enumerate(urls)])
    spec, dag_file = declared(tmp_path, TopologySpec("words", PostgresLogSource("tweets"), [
        StateSpec("url_counts", {"url": "text"}, combiner="count"),
        StateSpec("domain_counts", {"domain": "text"}, combiner="count")], max_batch_size=per_batch,
        job=SparkJob(str(job))))
    with Coordinator(dsn) as coord:
        coord.register(spec)
        for n in range(records // per_batch):
            txid = coord.plan("words", f"r{n}").txid
            done = connect_job(dsn, remote, str(job), "--topology", "words", "--txid", str(txid))
            assert done.returncode == 0, done.stderr[-3000:]
            coord.commit("words", txid)
    return job, dag_file, urls


def cli_json(dsn: str, capsys: Any, *argv: str) -> tuple[int, dict[str, Any]]:
    """An ``airflow-txn`` command's exit code and the JSON it printed (after anything it logged)."""
    capsys.readouterr()  # what the test logged before
    code = cli(["--dsn", dsn, *argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out[out.index("{\n"):])


def _preview(dsn: str, dag_file: str, capsys: Any, *flags: str) -> tuple[int, dict[str, Any]]:
    return cli_json(dsn, capsys, "correct", "words", "1..2", "--dag-file", dag_file, *flags)


def test_a_preview_commits_nothing_checks_determinism_and_names_what_a_fix_changes(
        dsn: str, tmp_path: Path, capsys: Any, spark_remote: str, spark_connect_conn: str) -> None:
    job, dag_file, urls = committed_words(dsn, spark_remote, tmp_path, 400, 200)
    with Coordinator(dsn) as coord:
        before = query(dsn, "SELECT url, value FROM url_counts ORDER BY 1")

        code, same = _preview(dsn, dag_file, capsys, "--check", "--spark-connect", spark_connect_conn)
        assert code == 0 and same["same_code"] and not same["nondeterministic"] and same["changed"] == 0

        # The fix: a URL's host is counted without its "www.". Its preview names what moves.
        job.write_text(job.read_text().replace('"url_counts": per_record(tweets, {"url": url})',
                                               '"url_counts": per_record(tweets, {"url": F.regexp_replace(url, '
                                               '"://www\\\\.", "://")})'))
        code, fix = _preview(dsn, dag_file, capsys, "--check", "--spark-connect", spark_connect_conn)
        assert code == 2 and not fix["same_code"]  # other code: no determinism to check
        www = Counter(u for u in urls if "www." in u)
        assert fix["states"]["url_counts"]["changed"] == 2 * len(www)  # each moves from one key to another
        assert fix["states"]["domain_counts"]["changed"] == 0
        assert fix["states"]["url_counts"]["old_total"] == fix["states"]["url_counts"]["new_total"] == len(urls)
        assert query(dsn, "SELECT url, value FROM url_counts ORDER BY 1") == before  # nothing committed
        assert [c["txid"] for c in coord.commits("words")] == [1, 2]
