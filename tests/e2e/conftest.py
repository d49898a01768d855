"""One real Airflow 3 (api-server, scheduler, dag-processor, triggerer; LocalExecutor on a
Postgres metadata DB) for the end-to-end tier, driven over the REST API the UI uses."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench.chaos import ChaosConfig, write_dag
from dev.kafka import KafkaBroker
from dev.localstack import LocalStack, RestClient, quiet_daily_schedule
from dev.s3 import S3Server
from tests.e2e.browsing import chromium

# The payments example's run: the chaos harness's, without faults (the mixes under faults are
# bench.chaos's alone, each fault asserted on its own in the tiers: docs/chaos.md), deployed as
# bench/dags/chaos_payments.py in place of the example, its batches on the stack's Spark Connect
# server.
PAYMENTS_RUN = replace(ChaosConfig.quick(seed=7, mode="payments", backend="connect"), faults=0)

REPO = Path(__file__).resolve().parents[2]


# The operations tests' own topologies (ops_count, ops_opaque, ops_killed, ops_deleted), and the
# deferred-waits test's (slots_0 ... slots_5), the liveness test's (busy_*).
OPS_DAGS = Path(__file__).resolve().parent / "dags" / "ops_dags.py"
SLOTS_DAGS = OPS_DAGS.with_name("slots_dags.py")
KAFKA_DAGS = OPS_DAGS.with_name("kafka_dags.py")
BUSY_DAGS = OPS_DAGS.with_name("busy_dags.py")
STALL_ALERTS = OPS_DAGS.with_name("stall_alerts.py")  # the stall watch's on_stall (test_stall_watch.py)
#: ops_fix's job (tests/e2e/dags/ops_dags.py, test_corrections.py): the stack writes it with the bug.
FIX_JOB = '''"""ops_fix's job: per-user sums of amounts ({version})."""
from pyspark.sql import functions as F

from airflow_transactional.spark_job import run


def transform(events):
    amount = F.col("amount").cast("long"){bug}
    return {{"amounts": events.groupBy(F.col("user").alias("name")).agg(F.sum(amount).alias("value"))}}


if __name__ == "__main__":
    raise SystemExit(run(transform, schema="user string, amount string", required=["user", "amount"]))
'''
FIX_BUG = ' * F.when(F.col("user") == "u3", 2).otherwise(1)'

# Where the stack's OpenLineage file transport writes, in its base directory.
LINEAGE_FILE = "openlineage.jsonl"


class StatsdListener:
    """A StatsD server for the test stack's metrics: a UDP socket drained by a thread, keeping the
    provider's lines (``airflow.transactional.<topology>.<metric>:<value>|<type>``) in order."""

    PREFIX = "airflow.transactional."

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        # Airflow's own metrics come here too: a receive buffer that outlasts a drain thread starved
        # of CPU on a busy machine (the kernel drops what a full buffer cannot take).
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 2**20)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            for line in data.decode(errors="replace").splitlines():
                if line.startswith(self.PREFIX):
                    self.lines.append(line)

    def values(self, topology_id: str, metric: str) -> list[tuple[float, str]]:
        """(value, type) of every datagram of one metric, in arrival order."""
        head = f"{self.PREFIX}{topology_id}.{metric}:"
        out = []
        for line in list(self.lines):
            if line.startswith(head):
                value, kind = line[len(head):].split("|")[:2]
                out.append((float(value), kind))
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture(scope="package")
def statsd() -> Iterator[StatsdListener]:
    listener = StatsdListener()
    yield listener
    listener.close()


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory, statsd: StatsdListener,
          kafka_broker: KafkaBroker) -> Iterator[LocalStack]:
    base = tmp_path_factory.mktemp("airflow")
    landing = base / "landing"
    landing.mkdir()
    dags = base / "dags"
    dags.mkdir()
    for dag_file in (REPO / "dags").glob("*.py"):  # the examples, as a user would deploy them
        if dag_file.name != "payments.py":  # the chaos run's own deployment of it (below)
            (dags / dag_file.name).symlink_to(dag_file)
    for own in (OPS_DAGS, SLOTS_DAGS, KAFKA_DAGS, BUSY_DAGS, STALL_ALERTS):
        (dags / own.name).symlink_to(own)
    write_dag(dags, PAYMENTS_RUN)
    (dags / "fix_job.py").write_text(FIX_JOB.format(version="with the bug", bug=FIX_BUG))  # test_corrections.py
    env = {
        # Runs are triggered over REST with explicit logical dates; the daily schedule only adds
        # the one scheduled run Airflow creates on unpause (the tests' own DAGs read it too).
        "AIRFLOW_TXN_EXAMPLE_SCHEDULE": quiet_daily_schedule(),
        "AIRFLOW_TXN_STALL_WATCH_SCHEDULE": quiet_daily_schedule(),  # checks triggered by test_stall_watch.py
        "AIRFLOW_TXN_ON_STALL": "stall_alerts.record",
        "AIRFLOW_TXN_STALL_ALERTS_FILE": str(base / "stall_alerts.jsonl"),
        "AIRFLOW_TXN_EXAMPLE_BATCH": "400",
        "AIRFLOW_TXN_LANDING_DIR": str(landing),
        # Tests arm faults in running tasks by writing this file (see dev/faults.py).
        "AIRFLOW_TXN_FAULTS_FILE": str(base / "faults.txt"),
        # Airflow's metrics go to the test's StatsD listener: the provider's commits report there.
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
        # OpenLineage events go to a file the tests read (lineage_events).
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(base / LINEAGE_FILE),
                                                       "append": True}),
    }
    # Four worker slots: waiting plans and commits wait in the triggerer, holding none of them
    # (test_deferred_waits.py would starve if they slept in workers).
    # A Spark Connect server beside Airflow (spark_connect_default) for the tests' own topologies.
    # An S3 server (S3Proxy) as aws_default, for the s3_orders example and test_object_landing_dags.py
    # (its link can be slowed down).
    st = LocalStack(base, dags, env=env, parallelism=4, kafka=kafka_broker,  # kafka_default: the session's broker
                    spark_connect=True, warm_connect=False, s3=S3Server(base / "s3", link=True))
    try:
        st.start()
        yield st
    finally:
        st.stop(remove=True)


#: What an ``airflow-txn`` recompute in a test (audit, correct, rebuild) adds to run the topology's job on the
#: stack's Spark Connect server rather than in a spark-submit driver of its own: no driver JVM to
#: start in the suite's busiest lane. test_transactional_dags.py keeps one spark-submit audit here;
#: tests/spark/test_spark_job.py runs the CLI's spark-submit recomputes.
ON_CONNECT = ["--spark-connect", "spark_connect_default"]


@pytest.fixture(scope="package", autouse=True)
def connect_connection(stack: LocalStack) -> Iterator[None]:
    """The stack's Spark Connect connection in this process too, for :data:`ON_CONNECT`."""
    name = "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"
    before = os.environ.get(name)
    os.environ[name] = stack.env()[name]
    yield
    if before is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = before


@pytest.fixture(scope="package")
def client(stack: LocalStack) -> RestClient:
    return stack.client()


def lineage_events(stack: LocalStack, job: str | None = None, event_type: str = "COMPLETE") -> list[dict[str, Any]]:
    """The OpenLineage events Airflow sent so far (of ``job``, ``<dag_id>.<task_id>``, if given)."""
    path = stack.base_dir / LINEAGE_FILE
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [e for e in events if e.get("eventType") == event_type and (job is None or e["job"]["name"] == job)]


def task_log(stack: LocalStack, dag_id: str, run_id: str, task_id: str) -> str:
    logs = sorted((stack.base_dir / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}")
                  .glob("attempt=*.log"))
    return "\n".join(p.read_text(errors="replace") for p in logs)


def wait_for_runs(stack: LocalStack, dag_id: str, run_ids: list[str], timeout: float = 900,
                  allow_failed: bool = False) -> dict[str, str]:
    """Wait until every run has finished; fail with the failed tasks' logs unless allowed."""
    client = stack.client()
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = {r: client.run(dag_id, r)["state"] for r in run_ids}
        if all(s in ("success", "failed") for s in states.values()):
            break
        time.sleep(1)  # a look is one cheap GET per run: every second of waiting here is the suite's
    else:
        stuck = [r for r, s in states.items() if s not in ("success", "failed")]
        raise AssertionError(f"runs of {dag_id} did not finish in {timeout:.0f}s: {states}\n"
                             + _unfinished(stack, dag_id, stuck))
    if not allow_failed and any(s == "failed" for s in states.values()):
        details = []
        for r, s in states.items():
            if s != "failed":
                continue
            for ti in client.task_instances(dag_id, r):
                if ti["state"] == "failed":
                    details.append(f"--- {r} {ti['task_id']}:\n{task_log(stack, dag_id, r, ti['task_id'])[-4000:]}")
        raise AssertionError(f"runs of {dag_id} failed: {states}\n" + "\n".join(details))
    return states


def _unfinished(stack: LocalStack, dag_id: str, run_ids: list[str]) -> str:
    """What each task of runs that did not finish is doing, and the end of the log of each one
    not done: what a run stuck for good waits on."""
    client, lines = stack.client(), []
    for r in run_ids:
        for ti in client.task_instances(dag_id, r):
            lines.append(f"--- {r} {ti['task_id']}: {ti['state']} (try {ti.get('try_number')})")
            if ti["state"] not in ("success", "failed", "skipped", "upstream_failed", None):
                try:
                    lines.append(task_log(stack, dag_id, r, ti["task_id"])[-3000:])
                except Exception as exc:  # the log may not exist yet: say so, keep the rest
                    lines.append(f"(no log: {exc})")
    return "\n".join(lines)


@pytest.fixture(scope="package")
def browser_session() -> Iterator[object]:
    """One headless Chromium for the package's tests that use it (tests/e2e/browsing.py)."""
    yield from chromium()


@pytest.fixture
def chrome(browser_session: Any) -> Iterator[object]:
    """The package's Chromium, left on a blank page after the test: an Airflow page left open keeps
    polling the api-server (and rendering) for the rest of the lane."""
    yield browser_session
    browser_session.switch_to.default_content()
    browser_session.get("about:blank")
