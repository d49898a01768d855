"""A Kafka-fed topology on a real Airflow, a real broker and real Spark (the ``kafka_words``
example's, on the stack's Spark Connect server): runs triggered over REST, a failed processing
retried, a committed run cleared and a backfill over new dates -- the counts are those of the
records producers committed (their own ledger), never an aborted one."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core.lag import PATIENT
from dev.demo import now_text
from dev.kafka import KafkaBroker
from dev.localstack import LocalStack, RestClient, on_schedule
from tests.e2e.browsing import frame_text, shot, signed_in
from tests.e2e.conftest import KAFKA_DAGS, ON_CONNECT, task_log, wait_for_runs
from tests.e2e.operating import set_faults
from tests.helpers import query
from tests.kafka_helpers import TransactionalProducer, create_topic, read_topic

pytestmark = pytest.mark.e2e

DAG = "kafka_counts"  # tests/e2e/dags/kafka_dags.py
DAY0 = datetime(2025, 9, 1, tzinfo=UTC)


def tweet(i: int) -> dict[str, str]:
    """A tweet as the demo's Kafka producer writes it (its time as text, as the job declares it)."""
    return {"url": f"https://{['apache.org', 'Example.com', 'www.kafka.apache.org'][i % 3]}/p/{i % 11}",
            "user": f"u{i % 7}", "ts": now_text()}


def _a_failed_scheduled_run_is_reprocessed_in_place_by_airflows_backfill(stack: LocalStack,
                                                                         client: RestClient) -> None:
    """Airflow's scheduled run (txid 1) fails for good -- every try's processing fails -- and
    Airflow's own Backfill (what its dialog posts) over that run's date, reprocessing failed runs,
    reaches that very run, whose logical date is the schedule's: txid 1 commits, in the same run."""
    set_faults(stack, f"process.begin:{DAG}:1=raise")
    client.unpause(DAG)
    deadline = datetime.now(UTC) + timedelta(minutes=3)
    while not client.runs(DAG):
        assert datetime.now(UTC) < deadline, f"Airflow scheduled no run of {DAG}"
        time.sleep(2)
    [scheduled] = client.runs(DAG)
    assert wait_for_runs(stack, DAG, [scheduled["dag_run_id"]], allow_failed=True) == {
        scheduled["dag_run_id"]: "failed"}
    set_faults(stack)
    backfill = client.post("/api/v2/backfills", {"dag_id": DAG, "from_date": scheduled["logical_date"],
                                                 "to_date": scheduled["logical_date"], "max_active_runs": 1,
                                                 "reprocess_behavior": "failed"})
    deadline = datetime.now(UTC) + timedelta(minutes=1)
    while client.run(DAG, scheduled["dag_run_id"])["state"] == "failed":  # cleared as the backfill is created
        assert datetime.now(UTC) < deadline, "the backfill did not reprocess the failed scheduled run"
        time.sleep(1)
    assert wait_for_runs(stack, DAG, [scheduled["dag_run_id"]]) == {scheduled["dag_run_id"]: "success"}
    coord = Coordinator(stack.state_dsn)
    try:
        assert coord.transaction(DAG, 1).run_key == scheduled["dag_run_id"] and coord.status(DAG).committed_txid == 1
    finally:
        coord.close()
    assert [r["dag_run_id"] for r in client.runs(DAG)] == [scheduled["dag_run_id"]]  # no new, empty txid beside it
    # Airflow refuses a DAG's next backfill until the scheduler marks this one complete (it looks
    # every 30 s): the test's next backfill waits for that, as a person's would.
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    while not client.get(f"/api/v2/backfills/{backfill['id']}").get("completed_at"):
        assert datetime.now(UTC) < deadline, "Airflow did not mark the backfill complete"
        time.sleep(2)


def drained(coord: Coordinator, dag_id: str) -> bool:
    """Whether the topology's lag is 0, as the broker says it (a busy machine's broker may take
    longer than a view's few seconds to: an unknown lag is no drained topic)."""
    st = coord.status(dag_id, lag_wait=PATIENT)
    return st.source_error is None and st.lag == 0


def test_the_kafka_topology_commits_what_producers_committed_through_retries_clears_and_backfills(
        stack: LocalStack, client: RestClient, kafka: KafkaBroker, chrome: object, tmp_path: Path) -> None:
    dsn = stack.state_dsn
    create_topic(kafka, 3, name="tweets")
    ledger: list[dict[str, str]] = []  # what the producers committed: the oracle
    producer = TransactionalProducer(kafka)
    for chunk in range(6):
        records = [tweet(chunk * 400 + i) for i in range(400)]
        producer.send("tweets", [(None, r) for r in records])
        if chunk % 3 == 2:
            producer.abort()  # never counted
        else:
            producer.commit()
            ledger += records
    client.wait_for_dag(DAG)
    _a_failed_scheduled_run_is_reprocessed_in_place_by_airflows_backfill(stack, client)
    coord = Coordinator(dsn)
    # txid 2's processing fails on its first try; Airflow retries it.
    once = stack.base_dir / "kafka-once"
    set_faults(stack, f"process.begin:{DAG}:2=raise@once:{once}")
    runs = [client.trigger(DAG, (DAY0 + timedelta(days=k)).isoformat())["dag_run_id"] for k in range(2)]
    wait_for_runs(stack, DAG, runs)
    set_faults(stack)
    assert once.exists()
    failed_once = coord.transaction(DAG, 2).run_key  # whichever triggered run planned txid 2
    tries = {t["task_id"]: t["try_number"] for t in client.task_instances(DAG, failed_once)}
    assert tries["process"] == 2  # failed once, retried once
    # A committed run cleared: a no-op. A backfill over later dates: new runs, new txids, the rest of the topic.
    client.clear(DAG, runs[0])
    more = [tweet(10_000 + i) for i in range(500)]
    producer.send("tweets", [(None, r) for r in more])
    producer.commit()
    ledger += more
    day10 = on_schedule(DAY0 + timedelta(days=10), stack.extra_env["AIRFLOW_TXN_EXAMPLE_SCHEDULE"])
    backfill = client.post("/api/v2/backfills", {"dag_id": DAG, "from_date": day10.isoformat(),  # three runs
                                                 "to_date": (day10 + timedelta(days=2)).isoformat(),
                                                 "max_active_runs": 3, "reprocess_behavior": "none"})
    assert backfill["dag_id"] == DAG
    deadline = datetime.now(UTC) + timedelta(minutes=5)
    while len(client.runs(DAG)) < 1 + len(runs) + 2:
        assert datetime.now(UTC) < deadline, "the backfill made no runs"
        time.sleep(2)
    wait_for_runs(stack, DAG, [r["dag_run_id"] for r in client.runs(DAG)])
    while not drained(coord, DAG):  # whatever the backfill's batches left
        run = client.trigger(DAG, None)["dag_run_id"]
        wait_for_runs(stack, DAG, [run])
    assert "already committed" in task_log(stack, DAG, runs[0], "commit")
    commits = coord.commits(DAG)
    assert [c["txid"] for c in commits] == list(range(1, len(commits) + 1))
    assert dict(query(dsn, "SELECT url, value FROM counts_url")) == Counter(r["url"] for r in ledger)
    assert sum(c["records_read"] for c in commits) == len(ledger)
    # The aborted records are in the topic; the commits skipped them and the markers, and counted them.
    assert len(read_topic(kafka, "tweets", committed_only=False)) - len(read_topic(kafka, "tweets")) == 800
    st = coord.status(DAG)
    assert st.quarantined == 0  # the demo's records, every one counted
    assert st.offsets_skipped == sum(int(v) for v in st.committed_offsets.values()) - len(ledger) > 800
    driver = signed_in(chrome, stack)  # and the topology's page says so
    driver.get(f"{stack.url}/dags/{DAG}/plugin/transactions-dag")  # type: ignore[attr-defined]
    assert f"{st.offsets_skipped:,} offsets skipped (aborted transactions' records" in frame_text(driver, "Timeline")
    shot(driver, "ui-kafka-topology.png", tmp_path)
    assert cli(["--dsn", dsn, "audit", DAG, "--dag-file", str(KAFKA_DAGS), *ON_CONNECT]) == 0
    coord.close()


def test_a_kafka_to_kafka_topology_relays_each_committed_record_once_per_txid_transaction(
        stack: LocalStack, client: RestClient, kafka: KafkaBroker) -> None:
    """The publish task after each commit: each txid's output in one Kafka transaction, in txid
    order, read back by a plain read_committed consumer -- also after a publish task is cleared."""
    create_topic(kafka, 2, name="relay-in")
    create_topic(kafka, 2, name="relay-out")
    producer = TransactionalProducer(kafka)
    kept = []
    for chunk in range(4):
        records = [tweet(20_000 + chunk * 200 + i) for i in range(200)]
        producer.send("relay-in", [(None, r) for r in records])
        if chunk == 1:
            producer.abort()
        else:
            producer.commit()
            kept += records
    client.wait_for_dag("kafka_relay")
    client.unpause("kafka_relay")
    deadline = time.monotonic() + 180
    while not client.runs("kafka_relay"):
        assert time.monotonic() < deadline, "Airflow scheduled no run of kafka_relay"
        time.sleep(2)
    runs = [r["dag_run_id"] for r in client.runs("kafka_relay")]
    runs += [client.trigger("kafka_relay", (DAY0 + timedelta(days=20 + k)).isoformat())["dag_run_id"]
             for k in range(2)]
    wait_for_runs(stack, "kafka_relay", runs)
    coord = Coordinator(stack.state_dsn)
    while not drained(coord, "kafka_relay"):
        extra = client.trigger("kafka_relay", None)["dag_run_id"]
        wait_for_runs(stack, "kafka_relay", [extra])
        runs.append(extra)
    client.clear("kafka_relay", runs[1], ["publish"])  # published again? nothing new: nothing twice
    wait_for_runs(stack, "kafka_relay", [runs[1]])
    assert "nothing new to publish" in task_log(stack, "kafka_relay", runs[1], "publish")
    relayed = read_topic(kafka, "relay-out")
    txids = [int(dict(m.headers())["airflow-txn-txid"]) for m in relayed]
    assert len(relayed) == len(kept)  # every committed record once; no aborted one
    assert Counter(json.loads(m.value())["url"] for m in relayed) == Counter(r["url"] for r in kept)
    assert len({m.key() for m in relayed}) == len(relayed)
    for txid in set(txids):  # one Kafka transaction per txid: its seq numbers 0..n-1
        seqs = sorted(int(dict(m.headers())["airflow-txn-seq"]) for m in relayed
                      if int(dict(m.headers())["airflow-txn-txid"]) == txid)
        assert seqs == list(range(len(seqs)))
    committed = coord.status("kafka_relay").committed_txid
    assert query(stack.state_dsn, "SELECT published_txid FROM airflow_txn.publications "
                                  "WHERE topology_id = 'kafka_relay'") == [(committed,)]
    coord.close()
