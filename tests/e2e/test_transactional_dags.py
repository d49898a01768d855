"""The example DAGs on a real Airflow + Spark + Postgres: transactions triggered over the REST
API (with and without a logical date) commit strictly in txid order, the state equals an oracle
computed straight from the events, the audit agrees, and processing overlaps commits."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional import EventLog
from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.sources.landed import write_json_lines
from airflow_transactional.spark import cds as spark_cds
from dev.demo import DOMAINS, Producer
from dev.localstack import LocalStack, RestClient
from tests.e2e.conftest import REPO, StatsdListener, lineage_events, task_log, wait_for_runs
from tests.e2e.operating import http_get as _http
from tests.helpers import query

pytestmark = pytest.mark.e2e

XSS = "<script>alert('txn')</script>"


def _trigger(client: RestClient, dag_id: str, n: int, start: datetime) -> list[str]:
    """n runs with strictly increasing past logical dates (microseconds kept, as the UI does)."""
    return [client.trigger(dag_id, (start + timedelta(minutes=k, microseconds=k + 1)).isoformat())["dag_run_id"]
            for k in range(n)]


def test_words_commits_in_txid_order_exactly_once_and_pipelines(stack: LocalStack, client: RestClient) -> None:
    dsn = stack.state_dsn
    log = EventLog(dsn, "tweets")
    log.create(4)
    # The demo's producer's tweets (a few malformed ones among them): all but those count.
    producer = Producer(dsn, stack.base_dir, rate=1, seed=3)
    tweets = [producer.tweet(i) for i in range(2000)]
    producer.log.close()
    good = [t for t in tweets if t[1].startswith('{"url": "https')]
    bad = [t for t in tweets if t not in good]
    bad += [(f"bad{i}", "{truncated" if i % 2 else json.dumps({"user": "no url"})) for i in range(8)]
    bad.append(("bad-markup", XSS))  # shown escaped by the Transactions views (test below)
    log.append(good[:1000] + bad + good[1000:])

    client.wait_for_dag("words")
    client.unpause("words")
    start = datetime.now(UTC) - timedelta(hours=2)
    runs = _trigger(client, "words", 5, start)  # batches of 400: five full ones
    runs.append(client.trigger("words", None)["dag_run_id"])  # no logical date: order still from Postgres
    wait_for_runs(stack, "words", runs)

    coord = Coordinator(dsn)
    status = coord.status("words")
    txids = {r: coord.transaction_for_run("words", r) for r in runs}
    assert all(t is not None and t.committed for t in txids.values())
    commits = coord.commits("words")
    # Every planned txid committed exactly once, in txid order (the audit log's timestamps).
    assert [c["txid"] for c in commits] == list(range(1, status.committed_txid + 1))
    assert [c["committed_at"] for c in commits] == sorted(c["committed_at"] for c in commits)
    assert sum(1 for c in commits if c["records_read"]) >= 5
    assert status.lag == 0 and not status.in_flight

    # The oracle, straight from the events appended.
    urls = Counter(json.loads(p)["url"] for _e, p in good)
    assert dict(query(dsn, "SELECT url, value FROM url_counts")) == urls and len(urls) > 10
    assert query(dsn, "SELECT count(*) FROM domain_counts")[0][0] == len(DOMAINS)
    assert status.quarantined == len(bad) < 30  # the producer's malformed rate and the 9 above: nothing else
    assert cli(["--dsn", dsn, "audit", "words", "--dag-file", str(REPO / "dags" / "words.py")]) == 0

    # Storm's design 3: a later txid was being processed before an earlier one committed.
    overlap = query(dsn, "SELECT count(*) FROM airflow_txn.attempts a JOIN airflow_txn.commits c "
                         "ON a.topology_id = c.topology_id AND a.txid > c.txid "
                         "WHERE a.topology_id = 'words' AND a.started_at < c.commit_started_at")[0][0]
    assert overlap > 0
    _check_the_tasks_of_an_empty_and_a_processed_batch(stack, client, commits)
    coord.close()
    log.close()


def _check_the_tasks_of_an_empty_and_a_processed_batch(stack: LocalStack, client: RestClient,
                                                       commits: list[dict[str, Any]]) -> None:
    # Empty batches cost no spark-submit, and one its plan committed not even a slot of the Spark
    # pool: the plan skips its process task at once; any other skips itself, saying why.
    run = client.trigger("words", None)["dag_run_id"]  # nothing new to read, every txid committed
    wait_for_runs(stack, "words", [run])
    ti = {t["task_id"]: t for t in client.task_instances("words", run)}
    assert ti["process"]["state"] == "skipped" and ti["process"]["queued_when"] is None, ti["process"]
    assert "process skipped (no spark-submit, no Spark pool slot)" in task_log(stack, "words", run, "plan")
    assert ti["commit"]["state"] == "success", ti["commit"]
    empty = next(c for c in commits if not c["records_read"])
    ti = {t["task_id"]: t for t in client.task_instances("words", empty["run_key"])}
    assert ti["process"]["state"] == "skipped"
    if "process skipped (no spark-submit, no Spark pool slot)" in task_log(stack, "words", empty["run_key"], "plan"):
        assert ti["process"]["queued_when"] is None and ti["process"]["start_date"] is None, ti["process"]
    else:
        assert "empty batch: no spark-submit" in task_log(stack, "words", empty["run_key"], "process")
    # The process task starts its driver JVM from the class-data-sharing archive `make test` built.
    startup = spark_cds.current()
    processed = next(c for c in commits if c["records_read"])
    said = task_log(stack, "words", processed["run_key"], "process")
    expected = f"starts from the class-data-sharing archive {startup.archive}" if startup else "airflow-txn spark-cds"
    assert expected in said
    # The task log is the job's, not Spark's routine warnings; a commit says so once.
    assert "FutureWarning" not in said and not re.search(r"\d\d:\d\d:\d\d WARN ", said)
    assert task_log(stack, "words", processed["run_key"], "commit").count(f"committed txid {processed['txid']} ") == 1


def test_the_transactions_views_show_what_postgres_holds(stack: LocalStack, client: RestClient) -> None:
    # Reads the words topology the test above committed (with its quarantined records).
    plugins = {p["name"]: p for p in client.get("/api/v2/plugins")["plugins"]}
    views = {v["destination"]: v["href"] for v in plugins["transactional"]["external_views"]}
    assert views == {"nav": "/transactional/", "dag": "/transactional/dags/{DAG_ID}",
                     "dag_run": "/transactional/dags/{DAG_ID}/runs/{RUN_ID}"}
    # Airflow mounts a plugin's app without authentication: the plugin asks for the user itself.
    for path in ("/transactional/", "/transactional/api/topologies", "/transactional/dags/words",
                 "/transactional/api/dags/words/runs/x/quarantine.csv"):
        assert _http(stack, path, None)[0] == 401, path
        assert _http(stack, path, "not-a-token")[0] == 403, path

    token = client.token()
    coord = Coordinator(stack.state_dsn)
    status = coord.status("words")
    listed = {t["topology_id"]: t for t in json.loads(_http(stack, "/transactional/api/topologies", token)[1])}
    words = listed["words"]
    assert (words["committed_txid"], words["quarantined"], words["lag_records"]) == (
        status.committed_txid, status.quarantined, status.lag)
    assert words["blocked_by"] is None and words["dag_id"] == "words"
    code, overview = _http(stack, "/transactional/", token)
    assert code == 200 and ">words</a>" in overview and "Transactions" in overview

    detail = json.loads(_http(stack, "/transactional/api/dags/words", token)[1])
    commits = {c["txid"]: c for c in coord.commits("words")}
    assert [t["txid"] for t in detail["timeline"]] == sorted(commits, reverse=True)[:30]
    for t in detail["timeline"]:
        assert t["commit"]["attempt"] == commits[t["txid"]]["attempt"], t
        assert t["commit"]["records_read"] == commits[t["txid"]]["records_read"], t
    assert "<svg" in _http(stack, "/transactional/dags/words", token)[1]

    # The run whose batch held the markup record: its page shows it escaped, never as markup.
    [(txid,)] = query(stack.state_dsn, "SELECT DISTINCT txid FROM airflow_txn.quarantine "
                                       "WHERE topology_id = 'words' AND record LIKE '%<script>%'")
    run_id = coord.transaction("words", txid).run_key
    quarantined = query(stack.state_dsn, "SELECT count(*) FROM airflow_txn.quarantine "
                                         "WHERE topology_id = 'words' AND txid = %s", (txid,))[0][0]
    run = json.loads(_http(stack, f"/transactional/api/dags/words/runs/{run_id}", token)[1])
    assert run["txid"] == txid and sum(r["records"] for r in run["quarantine_reasons"]) == quarantined
    code, page = _http(stack, f"/transactional/dags/words/runs/{run_id}", token)
    assert code == 200 and "&lt;script&gt;alert(&#x27;txn&#x27;)&lt;/script&gt;" in page and XSS not in page
    assert f"txid {txid}" in page and "Download CSV" in page
    code, csv_text = _http(stack, f"/transactional/api/dags/words/runs/{run_id}/quarantine.csv", token)
    assert code == 200 and csv_text.count("\n") == quarantined + 1 and XSS in csv_text  # data, not markup
    # A DAG that is no topology, and a run that does not exist: said in words, nothing leaks.
    assert "not a transactional topology" in _http(stack, "/transactional/dags/no_such_dag", token)[1]
    assert _http(stack, "/transactional/api/dags/words/runs/no-such-run", token)[0] == 404
    for _path, body in (_http(stack, p, token) for p in ("/transactional/", "/transactional/dags/words")):
        assert "password" not in body and stack.pg.password not in body
    coord.close()


def test_each_commit_reports_its_metrics_once_through_airflows_statsd(stack: LocalStack,
                                                                      statsd: StatsdListener) -> None:
    # The words commits of the test above, as a StatsD server heard them from Airflow's metrics.
    coord = Coordinator(stack.state_dsn)
    commits = coord.commits("words")
    status = coord.status("words")
    coord.close()
    assert commits
    txids = statsd.values("words", "committed_txid")
    assert sorted(v for v, _ in txids) == [c["txid"] for c in commits]  # one per commit, none twice
    assert {k for _, k in txids} == {"g"}
    assert sum(v for v, _ in statsd.values("words", "records_committed")) == sum(c["records_read"] for c in commits)
    assert sorted(v for v, _ in statsd.values("words", "batch_records")) == sorted(c["records_read"] for c in commits)
    assert sum(v for v, _ in statsd.values("words", "quarantined")) == sum(c["quarantined"] for c in commits) > 0
    durations = statsd.values("words", "commit_duration")
    assert len(durations) == len(commits) and all(k == "ms" and 0 < v < 60_000 for v, k in durations)
    # Each commit reports the lag it leaves; nothing was appended since the last one, so its
    # report is the lag now. The log knows when each event arrived: lag_seconds is sent too.
    lags = statsd.values("words", "lag_records")
    assert len(lags) == len(commits) and status.lag in {v for v, _ in lags}
    assert len(statsd.values("words", "lag_seconds")) == len(commits)
    assert {v for v, _ in statsd.values("words", "blocked")} == {0.0}


def test_each_task_tells_openlineage_what_it_read_wrote_and_which_txid(stack: LocalStack) -> None:
    # The words runs of the first test, as Airflow's OpenLineage listener reported them (a file
    # transport): the commit names the log it read and the state tables it wrote, with the rows
    # and the transaction; the process task's spark-submit carried its run id to Spark.
    from airflow_transactional.airflow.lineage import RUN_FACET, store_namespace

    coord = Coordinator(stack.state_dsn)
    commits = {c["txid"]: c for c in coord.commits("words")}
    coord.close()
    namespace, db = store_namespace(stack.state_dsn)
    reported = {}
    for event in lineage_events(stack, "words.commit"):
        facet = event["run"]["facets"][RUN_FACET]
        assert facet["topology"] == "words" and facet["committed"] is True
        assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [(namespace, f"{db}.airflow_txn.log.tweets")]
        reported[facet["txid"]] = (facet, {d["name"]: d for d in event["outputs"]})
    assert set(reported) == set(commits), "one COMPLETE commit event per committed txid"
    for txid, (facet, outputs) in reported.items():
        c = commits[txid]
        assert (facet["attempt"], facet["records"]) == (c["attempt"], c["records_read"])
        assert facet["endOffsets"] == {str(k): v for k, v in c["end_offsets"].items()}
        assert set(outputs) == {f"{db}.public.url_counts", f"{db}.public.domain_counts"}
        for table, rows in c["row_counts"].items():
            assert outputs[f"{db}.public.{table}"]["outputFacets"]["outputStatistics"]["rowCount"] == rows
    processed = [c for c in commits.values() if c["records_read"] and c["attempt"]]
    for c in processed:
        [event] = [e for e in lineage_events(stack, "words.process")
                   if e["run"]["facets"][RUN_FACET]["txid"] == c["txid"]]
        assert not event["outputs"] and event["inputs"]
        said = task_log(stack, "words", c["run_key"], "process")
        assert f"spark.openlineage.parentRunId={event['run']['runId']}" in said


def test_the_airflow_cli_works_with_just_the_stacks_home(stack: LocalStack) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(stack.home)
    res = subprocess.run([str(Path(sys.executable).with_name("airflow")), "dags", "list-import-errors"], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "migration" not in (res.stdout + res.stderr).lower()
    assert stat.S_IMODE(os.stat(stack.home / "airflow.cfg").st_mode) == 0o600  # it holds the fernet key


def test_landing_directory_topology_counts_every_file_once(stack: LocalStack, client: RestClient) -> None:
    landing = stack.extra_env["AIRFLOW_TXN_LANDING_DIR"]
    orders = [[{"user": f"u{(f * 7 + i) % 5}", "amount": i + f} for i in range(40)] for f in range(5)]
    for f, rows in enumerate(orders):
        write_json_lines(landing, f"orders-{f}.json", rows)
    with open(f"{landing}/orders-bad.json", "w") as fh:
        fh.write('{"user": "u1", "amount": 5}\n{"user": "u2"}\n')
    client.wait_for_dag("landing_orders")
    client.unpause("landing_orders")
    runs = _trigger(client, "landing_orders", 2, datetime.now(UTC) - timedelta(hours=3))
    wait_for_runs(stack, "landing_orders", runs)
    totals: Counter[str] = Counter()
    for rows in orders:
        for r in rows:
            totals[r["user"]] += r["amount"]
    totals["u1"] += 5
    got = {k: int(v) for k, v in query(stack.state_dsn, "SELECT \"user\", value FROM order_totals")}
    assert got == totals
    coord = Coordinator(stack.state_dsn)
    assert coord.status("landing_orders").quarantined == 1
    assert coord.status("landing_orders").lag == 0
    coord.close()


def test_the_ui_lists_the_dags_and_offers_the_state_store_connection_form(stack: LocalStack,
                                                                          client: RestClient) -> None:
    import urllib.request

    with urllib.request.urlopen(stack.url + "/", timeout=30) as resp:  # the UI's single-page app
        assert resp.status == 200 and b"<html" in resp.read().lower()
    dags = {d["dag_id"]: d for d in client.get("/api/v2/dags?tags=transactional")["dags"]}
    assert {"words", "global_count", "landing_orders"} <= set(dags)
    assert dags["words"]["max_active_runs"] == 3
    # The connection form's metadata (what the UI's "Add connection" page is built from).
    meta = {h["connection_type"]: h for h in client.get("/ui/connections/hook_meta")}
    store = meta["transactional"]
    assert store["hook_name"] == "Transactional state store (PostgreSQL)"
    assert store["standard_fields"]["url_schema"]["title"] == "Database"
