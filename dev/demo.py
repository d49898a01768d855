"""``make demo``: the example topologies committing real batches on a real local Airflow.

Starts the embedded PostgreSQL, a Kafka broker, Airflow 3 (api-server, scheduler, dag-processor,
triggerer) and the producers -- tweets to the ``tweets`` log (a few malformed, some delivered
twice) and in Kafka transactions (one in ten aborted: never counted), order files, payment
requests -- then unpauses the example DAGs and prints where to look. Ctrl-C stops it all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shlex
import signal
import socket
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from airflow_transactional import files
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import TransactionalError
from airflow_transactional.model import TopologyStatus
from airflow_transactional.sources import EventLog
from airflow_transactional.sources.landed import write_json_lines
from airflow_transactional.spark.submit import SPARK_CONNECT_CONN_ENV
from dev import payments
from dev.cluster import ClusterStack
from dev.kafka import KafkaBroker
from dev.localstack import SPARK_CONNECT, LocalStack
from dev.s3 import S3_BUCKET, S3_PREFIX, S3Orders

DAGS_DIR = Path(__file__).resolve().parents[1] / "dags"  # the repository's examples
# settlement first: it keeps the credits table the payments decision reads (its headroom).
DAGS = ("words", "kafka_words", "global_count", "landing_orders", "s3_orders", "settlement", "payments")
STALL_WATCH = "transactional_stall_watch"  # dags/stall_watch.py: checks every topology's stall rule
#: Below this many cores the demo runs its batches on Spark Connect unless told otherwise: on two
#: cores a driver JVM per batch fell behind the examples' one-minute schedule once drivers died now
#: and then (python -m bench.demo_soak; docs/getting-started.md).
FEW_CORES = 4
DOMAINS = ["example.com", "apache.org", "postgresql.org", "spark.apache.org", "kleppmann.com", "news.ycombinator.com"]


def now_text() -> str:
    """A tweet's time as the jobs declare it (``ts string``): text, never a number (quarantined)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _port(preferred: int) -> int | None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            return None


class Producer(threading.Thread):
    """Appends tweets to the event log and lands order files, until stopped."""

    def __init__(self, dsn: str, landing: Path, rate: int, seed: int | None = None, interval: float = 2.0) -> None:
        super().__init__(name="producer", daemon=True)
        self.log = EventLog(dsn, "tweets")
        self.landing = landing
        self.rate = rate
        self.interval = interval
        self.rng = random.Random(seed)
        # This run's event ids: a restarted demo must not re-send ids the log holds (all duplicates).
        self.run_id = uuid.uuid4().hex[:8]
        self.stop_event = threading.Event()
        self.sent = self.appended = self.malformed = self.duplicates = 0

    def event_id(self, n: int) -> str:
        return f"tw-{self.run_id}-{n}"

    def tweet(self, n: int) -> tuple[str, str]:
        if self.rng.random() < 0.005:
            self.malformed += 1
            return self.event_id(n), '{"url": truncated'
        domain = self.rng.choice(DOMAINS)
        url = f"https://{self.rng.choice(['', 'www.'])}{domain}/post/{self.rng.randint(1, 40)}"
        return self.event_id(n), json.dumps({"url": url, "user": f"u{self.rng.randint(1, 500)}", "ts": now_text()})

    def run(self) -> None:
        tick = 0
        while not self.stop_event.wait(self.interval):
            fresh = [self.tweet(self.sent + i) for i in range(max(1, int(self.rate * self.interval)))]
            batch = list(fresh)
            if self.sent and self.rng.random() < 0.3:  # a producer retry re-sends an old event id
                batch.append((self.event_id(self.rng.randrange(self.sent)), "{}"))
                self.duplicates += 1
            try:
                result = self.log.append(batch)
                self.sent += len(fresh)
                self.appended += result.appended
                if not result.appended:
                    logging.warning("producer: all %d events of this append were duplicates of events the log "
                                    "already holds: nothing new was appended", result.duplicates)
            except Exception as exc:  # the demo goes on; the append is all-or-nothing
                logging.warning("producer: append failed: %s", exc)
            tick += 1
            if tick % 8 == 0:
                orders = [{"user": f"u{self.rng.randint(1, 50)}", "amount": self.rng.randint(1, 500)}
                          for _ in range(self.rng.randint(50, 200))]
                write_json_lines(str(self.landing), f"orders-{int(time.time() * 1000)}.json", orders)


class KafkaTweets(threading.Thread):
    """Writes tweets to the ``tweets`` topic in Kafka transactions, aborting one in ten."""

    def __init__(self, broker: KafkaBroker, rate: int, interval: float = 2.0, topic: str = "tweets") -> None:
        from confluent_kafka import Producer

        super().__init__(name="kafka-tweets", daemon=True)
        self.topic = topic
        self.producer = Producer({**broker.client_config(), "transactional.id": f"demo-tweets-{uuid.uuid4().hex[:8]}"},
                                 logger=logging.getLogger("demo.kafka"))
        self.producer.init_transactions(60)
        self.per_tick = max(1, int(rate * interval))
        self.interval = interval
        self.rng = random.Random()
        self.stop_event = threading.Event()
        self.committed = self.aborted = 0

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            try:
                self.producer.begin_transaction()
                for _ in range(self.per_tick):
                    url = f"https://{self.rng.choice(DOMAINS)}/post/{self.rng.randint(1, 40)}"
                    tweet = {"url": url, "user": f"u{self.rng.randint(1, 500)}", "ts": now_text()}
                    self.producer.produce(self.topic, value=json.dumps(tweet))
                # Sent before the verdict: an abort right after produce() purges what librdkafka still
                # holds, and the topic would show abort markers without aborted records.
                self.producer.flush(60)
                if self.rng.random() < 0.1:  # a producer that gives up: its records are never read
                    self.producer.abort_transaction(60)
                    self.aborted += self.per_tick
                else:
                    self.producer.commit_transaction(60)
                    self.committed += self.per_tick
            except Exception as exc:  # the demo goes on
                logging.warning("kafka producer: %s", exc)


class PaymentRequests(threading.Thread):
    """Appends payment requests (a few invalid) for the payments example, after one deposit per account."""

    def __init__(self, dsn: str, per_second: float, interval: float = 3.0) -> None:
        super().__init__(name="payments", daemon=True)
        self.requests, ledger = payments.create_logs(dsn)
        payments.deposit(ledger, {a: 500 for a in payments.ACCOUNTS})  # once ever: the deposit ids are fixed
        ledger.close()
        self.per_tick = max(1, int(per_second * interval))
        self.interval = interval
        self.run_id = uuid.uuid4().hex[:8]  # a restarted demo sends new request ids
        self.stop_event = threading.Event()
        self.sent = 0

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            batch = payments.requests(self.per_tick, seed=self.sent, start=self.sent, invalid_every=40)
            for r in batch:
                r["id"] = f"{self.run_id}-{r['id']}"
            try:
                payments.send(self.requests, batch)
                self.sent += len(batch)
            except Exception as exc:  # the demo goes on; each append is all-or-nothing
                logging.warning("payments: append failed: %s", exc)


def banner(stack: LocalStack, base: Path, connect_chosen_for: int | None = None) -> str:
    """Where to look, and the commands to run -- none with a password in it: a command line shows in
    every local user's ``ps``. Clients read the state store's password from files of mode 600."""
    client = client_files(stack, base)
    s3_endpoint = stack.s3.endpoint if stack.s3 is not None else "-"
    env_line = "export " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in {**client, **kafka_env(stack)}.items())
    return f"""
Airflow UI   {stack.url}    (user admin; its password is in {base / 'passwords.json'}, mode 600)
Transactions {stack.url}/plugin/transactions    (Browse > Transactions: every topology, its txids
             in flight, lag, blockers; a Transactions tab on each DAG, a Transaction tab on each run)
DAGs         {', '.join(DAGS)} -- unpaused, one transaction a minute each (their schedule); clear
             tasks or create backfills in the UI and watch the numbers stay exactly right.
             {STALL_WATCH} checks every five minutes that none of them is stalled.
             A DAG you add to dags/ starts paused: unpause it in the UI (the toggle) or with
             the airflow CLI below.
Airflow CLI  export AIRFLOW_HOME={stack.home}   # then e.g. airflow dags list-import-errors
State        {env_line}
             .venv/bin/airflow-txn status words        # committed txid, in flight, lag, quarantine
             .venv/bin/airflow-txn status kafka_words  # the same topology fed by the Kafka topic tweets
             .venv/bin/airflow-txn audit words --dag-file dags/words.py   # recompute with Spark and diff
             psql service=airflow_txn -c 'SELECT * FROM domain_counts ORDER BY value DESC'
S3           s3_orders reads s3a://{S3_BUCKET}/{S3_PREFIX} on the S3 server (S3Proxy) at {s3_endpoint},
             Airflow's connection aws_default: an order file uploaded every 16 s, and now and then a
             committed file uploaded again with other orders -- a new version, counted in a later txid.
             S3Proxy keeps no versions: an upload overwritten before a plan listed it is never seen
             (a bucket with versioning enabled has every version counted: docs/guides/object-storage.md).
Payments     payments decides each request in its commit (and publishes them to the Kafka topic ledger);
             settlement credits the payees:
             psql service=airflow_txn -c 'SELECT granted, count(*) FROM airflow_txn.verdicts GROUP BY 1'
             psql service=airflow_txn -c 'SELECT * FROM credits ORDER BY account'
Logs         {base}/*.log    Ctrl-C stops everything.
""" + (cluster_banner(stack) if isinstance(stack, ClusterStack) else "") + connect_banner(stack, connect_chosen_for)


def client_files(stack: LocalStack, base: Path) -> dict[str, Path]:
    """Private client files (mode 600): the S3 connection (a secret) in the DSN's, for its status."""
    client = stack.pg.client_files(base)
    if stack.s3 is not None:
        files.write_private(client["AIRFLOW_TXN_DSN_FILE"], json.dumps(
            {"dsn": stack.pg.dsn("airflow_txn"), "connections": {"aws_default": stack.s3.settings()}}))
    return client


def connect_banner(stack: LocalStack, chosen_for: int | None = None) -> str:
    if not stack.spark_connect_port:
        return ""
    why = (f"             Chosen for this machine's {chosen_for} cores, where a driver JVM per batch falls behind;\n"
           "             make demo SPARK_CONNECT=0 runs a spark-submit per batch instead.\n" if chosen_for else "")
    return (f"Spark        every batch a client of the Spark Connect server on port {stack.spark_connect_port}\n"
            "             (warmed before the first; connection spark_connect_default): no JVM start per batch.\n" + why)


def revive_spark_connect(stack: LocalStack) -> bool:
    """Start the demo's Spark Connect server again if it exited, as systemd or Kubernetes would
    restart a production one: the batches it was serving fail their try once it is back and Airflow
    retries them; those that start while it is away wait for it (PySpark's client retries an
    unreachable server for ten minutes)."""
    proc = stack.procs.get(SPARK_CONNECT)
    if proc is None or proc.poll() is None:
        return False
    logging.warning("the Spark Connect server exited (%s): starting it again (its log: %s)", proc.returncode,
                    stack.base_dir / f"{SPARK_CONNECT}.log")
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # what it started (its Python workers), if any outlived it
    stack.start_component(SPARK_CONNECT)
    return True


def kafka_env(stack: LocalStack) -> dict[str, str]:
    """The Kafka connection a client of the state store needs for a Kafka-fed topology's status
    (its lag is read from the broker): the stack's loopback broker, no secret in it."""
    if stack.kafka is None:
        return {}
    return {"AIRFLOW_CONN_KAFKA_DEFAULT": stack.kafka.airflow_connection()}


def cluster_banner(stack: ClusterStack) -> str:
    workers = ", ".join(stack.celery_workers)
    return f"""Cluster      CeleryExecutor: {workers} (broker: Redis on 127.0.0.1:{stack.redis.port});
             Spark standalone master {stack.spark.url} with {len(stack.spark.workers)} workers: each process task's
             driver runs in the Celery worker that runs it, its executors on the Spark workers.
"""


def quiet_kafka_clients() -> None:
    """librdkafka's transient notes ("Coordinator load in progress" while the broker starts) are not
    the demo's news: its Kafka clients' errors still show."""
    for name in ("airflow_transactional.sources.kafka.librdkafka", "airflow_transactional.sinks.kafka.librdkafka",
                 "demo.kafka", "dev.kafka.librdkafka"):
        logging.getLogger(name).setLevel(logging.ERROR)


def status_line(dag_id: str, st: TopologyStatus) -> str:
    """One topology in the demo's console line: what committed, what is in flight, the lag in what
    its source counts -- and, loudly, what blocks or stalls it."""
    lag = f"lag unknown ({st.source_error})" if st.source_error else f"lag {st.lag:,} {st.lag_unit}"
    said = (f"{dag_id}: txid {st.committed_txid} committed, {len(st.in_flight)} in flight, {lag}, "
            f"quarantined {st.quarantined}")
    if st.blocked_by:
        said += f", {'STALLED' if st.stalled else 'BLOCKED'} (airflow-txn status {dag_id} says why)"
    return said


def start_producers(stack: LocalStack, landing: Path,
                    rate: int) -> tuple[Producer, KafkaTweets, PaymentRequests, S3Orders]:
    """The demo's producers, each on its thread: tweets to the event log and order files, tweets to
    Kafka in transactions, payment requests, order files to the S3 server."""
    EventLog(stack.state_dsn, "tweets").create(4)
    producer = Producer(stack.state_dsn, landing, rate)
    producer.start()
    assert stack.kafka is not None
    stack.kafka.create_topic("tweets", 3)
    stack.kafka.create_topic("ledger", 4)  # where payments publishes its decisions
    kafka_tweets = KafkaTweets(stack.kafka, rate)
    kafka_tweets.start()
    requests = PaymentRequests(stack.state_dsn, per_second=max(1.0, rate / 10))
    requests.start()
    assert stack.s3 is not None
    stack.s3.create_bucket(S3_BUCKET)
    s3_orders = S3Orders(stack.s3, stack.state_dsn)
    s3_orders.start()
    return producer, kafka_tweets, requests, s3_orders


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="var/demo", help="where the demo keeps Postgres, Airflow and logs")
    parser.add_argument("--port", type=int, default=8080, help="Airflow UI/API port (a free one if taken)")
    parser.add_argument("--rate", type=int, default=50, help="tweets per second from the producer")
    parser.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0: Ctrl-C)")
    parser.add_argument("--cluster", action="store_true",
                        help="CeleryExecutor (Redis, two workers) and a Spark standalone cluster (two workers)")
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument("--spark-connect", action="store_true", default=None,
                         help="run every batch on a Spark Connect server the demo starts (no JVM start per batch; "
                              f"the default on a machine of fewer than {FEW_CORES} cores, without --cluster)")
    backend.add_argument("--spark-submit", dest="spark_connect", action="store_false",
                         help="run every batch in a spark-submit of its own (the default otherwise)")
    args = parser.parse_args(argv)
    args.connect_chosen_for = None
    if args.spark_connect is None:
        cores = os.cpu_count() or 1
        args.spark_connect = not args.cluster and cores < FEW_CORES
        args.connect_chosen_for = cores if args.spark_connect else None
    return args


def make_stack(args: argparse.Namespace, base: Path, landing: Path) -> LocalStack:
    env = {"AIRFLOW_TXN_LANDING_DIR": str(landing), "AIRFLOW_TXN_PAYMENTS_KAFKA_TOPIC": "ledger",
           # The example DAGs declare their Spark with spark_backend(): this moves them onto the server.
           **({SPARK_CONNECT_CONN_ENV: "spark_connect_default"} if args.spark_connect else {})}
    return (ClusterStack if args.cluster else LocalStack)(base, DAGS_DIR, port=_port(args.port), kafka=True, s3=True,
                                                          env=env, spark_connect=args.spark_connect)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    quiet_kafka_clients()

    base = Path(args.dir).resolve()
    landing = base / "landing"
    landing.mkdir(parents=True, exist_ok=True)
    stack = make_stack(args, base, landing)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    # Ctrl-C stops the demo however it was started: a process started in the background of a
    # shell without job control inherits SIGINT ignored, and Python then leaves it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    producer: Producer | None = None
    requests: PaymentRequests | None = None
    kafka_tweets: KafkaTweets | None = None
    s3_orders: S3Orders | None = None
    try:
        print("starting PostgreSQL, Kafka, an S3 server and Airflow (api-server, scheduler, dag-processor, triggerer"
              + (", two Celery workers; Redis; a Spark master and two workers" if args.cluster else "") + ")...",
              flush=True)
        stack.start()
        if isinstance(stack, ClusterStack) and args.spark_connect:  # a cluster's server starts on demand
            stack.start_spark_connect()
        producer, kafka_tweets, requests, s3_orders = start_producers(stack, landing, args.rate)
        client = stack.client()
        for dag_id in (*DAGS, STALL_WATCH):
            client.wait_for_dag(dag_id)
            client.unpause(dag_id)
        print(banner(stack, base, args.connect_chosen_for), flush=True)
        os.environ.update(kafka_env(stack))  # the status lines below read kafka_words' lag from the broker
        if stack.s3 is not None:  # ... and s3_orders' from the bucket (in this process only: it holds the secret)
            os.environ["AIRFLOW_CONN_AWS_DEFAULT"] = stack.s3.airflow_connection()
        coordinator = Coordinator(stack.state_dsn)
        deadline = time.monotonic() + args.duration if args.duration else None
        while not stopping.wait(15):
            revive_spark_connect(stack)
            line = []
            for dag_id in DAGS:
                try:
                    line.append(status_line(dag_id, coordinator.status(dag_id)))
                except TransactionalError:
                    line.append(f"{dag_id}: waiting for its first plan")
            logging.info(" | ".join(line))
            if deadline and time.monotonic() > deadline:
                break
        coordinator.close()
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping...", flush=True)
        for thread in (producer, requests, kafka_tweets, s3_orders):
            if thread is not None:
                thread.stop_event.set()
        stack.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
