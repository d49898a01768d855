"""The same ``words`` job as a Spark Connect client of a real, long-lived Spark Connect server:
the job file runs under plain ``python`` with ``$SPARK_REMOTE``, reads Postgres log chunks and
COPYs its partials as Arrow batches on the server's executors, and the committed state equals
the oracle computed from the events appended -- bad records in the quarantine, a replayed txid
committed once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional import EventLog, LandingDirectory, PostgresLogSource, StateSpec, TopologySpec
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.spark.pinned import recorded
from airflow_transactional.spark.warm import ROUNDS, warm_in_child, warm_server
from dev.cluster import descendants
from dev.embedded import free_port
from dev.sparkconnect import ConnectServer
from tests.helpers import as_nobody, fetch_blocks_as_nobody, listening_ports, query, spark_submit

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
WORDS = str(REPO / "spark_jobs" / "words.py")


def _client(dsn: str, remote: str, txid: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, WORDS, "--topology", "words_sc", "--txid", str(txid)],
                          env={**os.environ, "AIRFLOW_TXN_DSN": dsn, "SPARK_REMOTE": remote},
                          capture_output=True, text=True, timeout=300)


def test_words_job_on_spark_connect_commits_exactly_what_the_log_holds(dsn: str, spark_remote: str) -> None:
    log = EventLog(dsn, "tweets_sc")
    log.create(3)
    hosts = ["www.apache.org", "Spark.Apache.org", "example.com", "www.example.com"]
    good = [(f"tw{i}", json.dumps({"url": f"https://{hosts[i % 4]}/p{i % 13}", "user": f"u{i % 5}"}))
            for i in range(1500)]
    bad = [("bad-json", "{not json"), ("no-url", json.dumps({"user": "x"}))]
    log.append(good[:700] + bad + good[700:])
    coord = Coordinator(dsn)
    coord.register(TopologySpec("words_sc", PostgresLogSource("tweets_sc"), [
        StateSpec("url_counts", {"url": "text"}, combiner="count", table="sc_url_counts"),
        StateSpec("domain_counts", {"domain": "text"}, combiner="count", kind="opaque", table="sc_domain_counts"),
    ], max_batch_size=800, max_in_flight=5))
    txids = [coord.plan("words_sc", f"run{k}").txid for k in range(2)]
    for t in (2, 1, 1):  # out of order, and txid 1 twice (a replay)
        res = _client(dsn, spark_remote, t)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "Spark Connect session" in res.stderr
    for t in txids:
        assert coord.commit("words_sc", t).committed
    assert coord.status("words_sc").lag == 0

    urls = Counter(json.loads(p)["url"] for _e, p in good)
    assert dict(query(dsn, "SELECT url, value FROM sc_url_counts")) == urls
    domains: Counter[str] = Counter()
    for url, n in urls.items():
        host = url.split("/")[2].lower()
        domains[host.removeprefix("www.")] += n
    assert {k: int(v) for k, v in query(dsn, "SELECT domain, value FROM sc_domain_counts")} == domains
    quarantined = query(dsn, "SELECT event_id FROM airflow_txn.quarantine WHERE committed ORDER BY 1")
    assert [e for (e,) in quarantined] == ["bad-json", "no-url"]
    attempts = query(dsn, "SELECT attempt, status FROM airflow_txn.attempts WHERE txid = 1 ORDER BY 1")
    assert attempts == [(1, "discarded"), (2, "committed")]
    coord.close()


PROBE = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
print(spark.range(3).count())
"""


def test_the_server_serves_only_a_client_with_its_token_and_holds_no_secret(
        spark_remote: str, tmp_path: Path) -> None:
    """Regression: the server the stack and the bench started accepted any local client, and a
    client as ``nobody`` read the server's environment (the state store's DSN) and files."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"}
    port = spark_remote.split(":")[2].split("/")[0]
    ok = subprocess.run([sys.executable, str(probe), spark_remote], env=env, capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip().endswith("3"), ok.stderr[-2000:]
    for remote in (f"sc://localhost:{port}/;token=wrong-token", f"sc://localhost:{port}", f"sc://127.0.0.1:{port}"):
        refused = subprocess.run([sys.executable, str(probe), remote], env=env, capture_output=True, text=True,
                                 timeout=120)
        assert refused.returncode != 0, remote
        assert "UNAUTHENTICATED" in refused.stderr or "Invalid authentication" in refused.stderr, refused.stderr[-2000:]


CLOSURE = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
secret = "hunter2-" + "in-a-closure"

def stage(batches):
    import pyarrow as pa
    for _batch in batches:
        yield pa.RecordBatch.from_pydict({"n": [len(secret)]})

print(spark.range(4).mapInArrow(stage, "n long").count())
"""


def test_another_local_user_fetches_no_block_from_the_server(connect_server: ConnectServer, tmp_path: Path) -> None:
    """Regression: the token guards gRPC only. The server's block manager served a task's closure
    -- the staging COPY's held the DSN -- to ``nobody``, who needed no token."""
    client = tmp_path / "closure.py"
    client.write_text(CLOSURE)
    ran = subprocess.run([sys.executable, str(client), connect_server.url], capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert connect_server.proc is not None
    ports = set().union(*(listening_ports(pid) for pid in descendants(connect_server.proc.pid))) - {connect_server.port}
    assert ports, "the server's JVM listens on no port but gRPC's"
    answers = {port: fetch_blocks_as_nobody(port, [f"broadcast_{n}_piece0" for n in range(6)]) for port in ports}
    assert not [port for port, got in answers.items() if "GOT" in got], answers
    # Its RPC and its block manager turned nobody away for want of the secret.
    assert sum("Expected SaslMessage" in got for got in answers.values()) >= 2, answers


def test_the_servers_environment_has_its_token_and_none_of_the_stores_secrets() -> None:
    from airflow_transactional.spark.connect_server import spark_connect_server_argv, spark_connect_server_env

    base = {"PATH": "/usr/bin", "AIRFLOW_TXN_DSN": "host=h password=s3cret", "AIRFLOW_TXN_DSN_FILE": "/x",
            "AIRFLOW_CONN_TRANSACTIONAL_DEFAULT": '{"password": "s3cret"}', "AIRFLOW__API_AUTH__JWT_SECRET": "j",
            # Regression: the filter was a deny-list, and a secret under any other name passed.
            "PGPASSWORD": "s3cret", "AWS_SECRET_ACCESS_KEY": "s3cret", "REDIS_URL": "redis://:s3cret@h",
            "SPARK_LOCAL_IP": "127.0.0.1", "LC_ALL": "C.UTF-8", "JAVA_HOME": "/jdk",
            # Regression: SPARK_* and PYSPARK_* passed by prefix, whatever they held.
            "SPARK_ANYTHING_SECRET": "s3cret", "PYSPARK_TOKEN": "s3cret"}
    env = spark_connect_server_env("tok", base)
    assert env == {"PATH": "/usr/bin", "SPARK_CONNECT_AUTHENTICATE_TOKEN": "tok", "SPARK_LOCAL_IP": "127.0.0.1",
                   "LC_ALL": "C.UTF-8", "JAVA_HOME": "/jdk"}
    assert spark_connect_server_env("tok", {"MINE": "x"}, keep=("MINE",))["MINE"] == "x"
    assert not any("tok" == a or "token" in a for a in spark_connect_server_argv(15002))


def test_a_server_is_warmed_by_a_checked_batch_of_made_up_records(spark_remote: str) -> None:
    took = warm_server(spark_remote, rounds=2, records=3000)  # each round's fold checked against its count
    assert len(took) == 2 and all(t > 0 for t in took)
    # Regression: the remote session left SPARK_CONNECT_MODE_ENABLED set in this process, and every
    # classic session started here (and in the processes it started) after it failed.
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
    assert len(warm_in_child(spark_remote)) == ROUNDS  # python -m airflow_transactional.spark.warm
    with pytest.raises(ConfigError, match="sc://"):
        warm_server("http://localhost:15002")
    with pytest.raises(ConfigError, match="1 to 1,900,000"):
        warm_server(spark_remote, records=2_000_000)


def landing_glob_names(dsn: str, topology: str, directory: Path, run: Callable[[int], Any]) -> None:
    """Files whose names are globs (``[ab].json``, ``*.json``, ``b?.json``, ``{a,b}.json``) beside the
    files those globs match, planned as one txid and processed by ``run(txid)`` (a job whose
    executors are not the driver's): each file's lines counted once, none twice."""
    names = ["a.json", "b.json", "[ab].json", "*.json", "b?.json", "{a,b}.json"]
    lines: dict[str, list[str]] = {}
    for k, name in enumerate(names):
        lines[name] = [json.dumps({"url": f"https://example.com/{k}/{i % 3}", "user": "u"}) for i in range(5 + k)]
        (directory / name).write_text("\n".join(lines[name]) + "\n{not json " + str(k) + "}\n")
    coord = Coordinator(dsn)
    coord.register(TopologySpec(topology, LandingDirectory(str(directory), settle_seconds=0), [
        StateSpec("url_counts", {"url": "text"}, combiner="count", table=f"{topology}_urls"),
        StateSpec("domain_counts", {"domain": "text"}, combiner="count", table=f"{topology}_domains"),
    ]))
    txid = coord.plan(topology, "r1").txid
    res = run(txid)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # The same txid again under spark-submit on local[2] (executors in the driver's process): the
    # attempt must read the same records, offsets spelled alike, or it fails as a changed source.
    again = spark_submit(dsn, WORDS, "--topology", topology, "--txid", str(txid))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert coord.commit(topology, txid).committed
    want = Counter(json.loads(x)["url"] for name in names for x in lines[name])
    assert dict(query(dsn, f"SELECT url, value FROM {topology}_urls")) == want
    # Each file's bad line quarantined once, under the name planned (as a driver on local[N] spells it).
    assert sorted(query(dsn, "SELECT source_offset FROM airflow_txn.quarantine WHERE committed "
                             f"AND topology_id = '{topology}'")) == \
        sorted((recorded(str(directory / name)),) for name in names)
    coord.close()


def test_a_landing_file_named_as_a_glob_is_read_literally_on_spark_connect(
        dsn: str, spark_remote: str, tmp_path: Path) -> None:
    """Regression: on Spark Connect a planned local name went to Spark's reader unescaped, and the
    txid that planned ``[ab].json`` read ``a.json`` and ``b.json`` (never its own), the one that
    planned ``*.json`` every file: other txids' records counted again."""
    landing_glob_names(dsn, "globs_sc", tmp_path, lambda t: subprocess.run(
        [sys.executable, WORDS, "--topology", "globs_sc", "--txid", str(t)],
        env={**os.environ, "AIRFLOW_TXN_DSN": dsn, "SPARK_REMOTE": spark_remote},
        capture_output=True, text=True, timeout=300))


def test_the_dsn_goes_only_to_a_server_that_keeps_uploaded_files_private(
        dsn: str, spark_remote: str, connect_server: ConnectServer, tmp_path: Path) -> None:
    """Regression: a server keeps its own copy of every uploaded file under its
    ``java.io.tmpdir/artifacts-*``, made with its umask: one started under umask 022 in a temp
    directory others may enter left the state store's DSN readable to ``nobody``. Such a server is
    now refused before the DSN is sent; the server the project starts (umask 077, a private
    scratch) takes it, and ``nobody`` reads none of its copies."""
    import tempfile

    open_dir = Path(tempfile.mkdtemp(prefix="airflow-txn-open-"))  # a temp directory every user may enter
    open_dir.chmod(0o755)
    careless = ConnectServer(free_port(), open_dir / "server.log", umask=0o022).start()
    try:
        careless.wait(120)
        log = EventLog(dsn, "tweets_exposed")
        log.create(1)
        log.append([("t1", json.dumps({"url": "https://example.com/a"}))])
        coord = Coordinator(dsn)
        coord.register(TopologySpec("exposed_sc", PostgresLogSource("tweets_exposed"),
                                    [StateSpec("exposed_urls", {"url": "text"}, combiner="count")]))
        txid = coord.plan("exposed_sc", "r1").txid
        refused = subprocess.run([sys.executable, WORDS, "--topology", "exposed_sc", "--txid", str(txid)],
                                 env={**os.environ, "AIRFLOW_TXN_DSN": dsn, "SPARK_REMOTE": careless.url},
                                 capture_output=True, text=True, timeout=300)
        assert refused.returncode != 0
        assert "keeps the files a session uploads where other local users can read them" in refused.stderr
        assert "umask 077 with a private java.io.tmpdir" in refused.stderr, refused.stderr[-3000:]
        uploaded = [p.name for p in (open_dir / "scratch").rglob("airflow-txn-*") if p.is_file()]
        assert uploaded and all(name.startswith("airflow-txn-probe-") for name in uploaded), uploaded  # no DSN
        coord.close()
        log.close()
    finally:
        careless.stop()
        subprocess.run(["rm", "-rf", str(open_dir)], check=False)

    # The project's own server: the DSN went up (the jobs above ran on it), and no copy is nobody's to read.
    copies = [p for p in (connect_server.log.parent / "scratch").rglob("airflow-txn-dsn-*") if p.is_file()]
    assert copies
    for copy in copies:
        denied = as_nobody(["/bin/cat", str(copy)])
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, copy
