"""The ``verify`` section of ``bench.perf``: what the shadow audit (``core/verify.py``) costs the
topology. N batches of the words job, each processed by a spark-submit and committed as the process
and commit tasks do (the baseline, audit off), against the same with the audit on -- every txid
recomputed by rounds of the job's ``--verify`` mode, one round per ten txids, and 1 in 10 of them
sampled -- on the same two cores, one after the other: the throughput the audit leaves the topology
when it has no spare cores to run on. Then what a round's add-up check (every state against its
delta history) costs on a state of many keys with a long history, against the commit of one batch;
and what the digest of a commit's output events costs that commit."""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from dataclasses import replace

from psycopg2 import sql

from airflow_transactional import OutputSpec, StateSpec, TopologySpec
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import attempts
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spark import cds
from airflow_transactional.spark.submit import provider_zip, spark_submit_argv, with_quiet_driver_logs
from airflow_transactional.store import outputs
from bench.measure import DOMAINS, WORDS_JOB, Report, Row, Sizes, median, run_measured
from bench.sections.history import commit_deltas, counts_topology
from bench.sections.work import words_topology

log = logging.getLogger("bench.perf")

#: Batches of the throughput rows, their records, and the txids a round checks at most.
TXIDS = 10
RECORDS = 50_000
ROUND = 10
#: The add-up row: the keys of the state and the txids of history behind it (100,000 deltas each).
DRIFT_TXIDS = 20
#: The output-digest row: the events one commit appends, and its trials.
EVENTS = 100_000
DIGEST_TRIALS = 5


def _submit(coord: Coordinator, topology: str, mode: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU-s, wall s) of one spark-submit of the words job on ``topology`` in ``mode``."""
    conf = cds.with_archive(with_quiet_driver_logs({"spark.ui.enabled": "false"}), cds.current())
    argv = [*spark_submit_argv("local[2]", conf, "--name", f"verify-{topology}"), "--py-files", provider_zip(),
            str(WORDS_JOB), "--topology", topology, "--schema", coord.schema, *mode]
    return run_measured(argv, env, f"verify: the words job on {topology} ({' '.join(mode)})")


def _batch(coord: Coordinator, topology: str, i: int, every: int | None, env: dict[str, str]) -> tuple[float, float]:
    """Process and commit batch ``i``; with ``every``, after each ``ROUND`` of them a round of the
    audit (1 in ``every``). (CPU-s, wall s) of it."""
    t0 = time.perf_counter()
    txid = coord.plan(topology, f"r{i}").txid
    cpu, _w = _submit(coord, topology, ["--txid", str(txid)], env)
    coord.commit(topology, txid)
    wall = time.perf_counter() - t0
    if every is not None and (i + 1) % ROUND == 0:
        c, w = _submit(coord, topology, ["--verify", f"{ROUND}:{every}"], env)
        cpu, wall = cpu + c, wall + w
    return cpu, wall


def _throughput(coord: Coordinator, dsn: str, report: Report) -> None:
    events = EventLog(dsn, "bench_verify")
    events.create(2)
    rng = random.Random(7)
    for chunk in range(TXIDS):
        events.append([(f"v{chunk}-{i}", json.dumps({"url": f"https://{DOMAINS[rng.randrange(5)]}/p{rng.randrange(500)}",
                                                     "user": "u"})) for i in range(RECORDS)])
    events.close()
    env = {**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    configs = [("bench_verify_off", None), ("bench_verify_all", 1), ("bench_verify_tenth", 10)]
    for name, _every in configs:
        coord.register(replace(words_topology(name, PostgresLogSource("bench_verify"), RECORDS),
                               max_in_flight=TXIDS + 1))
    runs = {name: (0.0, 0.0) for name, _every in configs}
    for i in range(TXIDS):  # batch by batch, the three taking turns at going first: no drift favours one
        for name, every in configs[i % 3:] + configs[:i % 3]:
            cpu, wall = _batch(coord, name, i, every, env)
            runs[name] = (runs[name][0] + cpu, runs[name][1] + wall)
    for name, _every in configs[1:]:
        status = coord.verify_status(name)
        assert status["verified_through"] == TXIDS and not status["counts"].get("failed"), status
    off = runs["bench_verify_off"]
    for name, what, target in (("bench_verify_all", "every txid", 0.8), ("bench_verify_tenth", "1 in 10", 0.95)):
        on = runs[name]
        ratio = off[1] / on[1]  # events per second with the audit, against without: the inverse of the times
        report.add(Row("verify", f"the topology's throughput with the shadow audit checking {what} (a round per "
                                 f"{ROUND} txids) vs off: {TXIDS} batches of {RECORDS:,} events, spark-submit each",
                       f"{TXIDS * RECORDS / on[1]:,.0f} ev/s", f"{TXIDS * RECORDS / off[1]:,.0f} ev/s", ratio,
                       f">= {target}x", ratio >= target,
                       note=f"CPU {on[0]:.1f} vs {off[0]:.1f} CPU-s; the rounds run on the same two cores as "
                            "the processing, one after the other; the three runs' batches take turns"))


def _add_up(coord: Coordinator, report: Report) -> None:
    """A round's add-up check of a state of 100,000 keys with ``DRIFT_TXIDS`` txids of history
    (100,000 deltas each) vs committing one of those txids."""
    events = EventLog(coord.dsn, "bench_verify_h")
    events.create(1)
    events.append([(f"h{i}", "{}") for i in range(DRIFT_TXIDS)])
    events.close()
    counts_topology(coord, "bench_verify_drift", "bench_verify_h")
    commits = [commit_deltas(coord, "bench_verify_drift", f"d{i}") for i in range(DRIFT_TXIDS)]
    with coord.store.db.transaction() as cur:  # the history as autovacuum would leave it
        cur.execute("ANALYZE")
    took = []
    for _ in range(3):
        t0 = time.perf_counter()
        with coord.verifying("bench_verify_drift", budget=1) as rnd:  # checks the states, recomputes nothing here
            assert not rnd.settled.get(DRIFT_TXIDS) == "failed"
        took.append(time.perf_counter() - t0)
    one_commit, best = sorted(commits)[len(commits) // 2], min(took)
    report.add(Row("verify", f"a round's add-up check: a state of 100,000 keys against its {DRIFT_TXIDS * 100_000:,} "
                             "deltas of history, vs the commit of one txid of 100,000 deltas",
                   f"{best:.2f} s", f"{one_commit:.2f} s", best / one_commit,
                   note="once per round, whatever the round recomputes; it grows with the history kept "
                        "(airflow-txn history --keep folds old txids into a snapshot)"))


def _event_digest(coord: Coordinator, report: Report) -> None:
    """What the digest of a commit's output events costs it: ``EVENTS`` events staged by one
    attempt, their digest taken as the commit takes it (the count it checks, with their hashes),
    against the commit that appends them."""
    events = EventLog(coord.dsn, "bench_verify_in")
    events.create(1)
    events.append([(f"i{i}", "{}") for i in range(DIGEST_TRIALS + 1)])
    events.close()
    coord.register(TopologySpec("bench_verify_out", PostgresLogSource("bench_verify_in"),
                                [StateSpec("counts", keys={"k": "text"}, table="bench_verify_out")],
                                outputs=[OutputSpec("out", log="bench_verify_out", partitions=4)], max_batch_size=1,
                                max_in_flight=DIGEST_TRIALS + 2))
    shares, commits = [], []
    for trial in range(DIGEST_TRIALS + 1):
        txn = coord.plan("bench_verify_out", f"t{trial}")
        attempt, txn = attempts.begin_attempt(coord.store, "bench_verify_out", txn.txid)
        staged = coord.stage_events(attempt, [("out", i % 4, i, f"t{trial}-e{i}", json.dumps({"n": i, "t": trial}),
                                               None, None, None, None) for i in range(EVENTS)])
        attempts.finish_attempt(coord.store, attempt, {"counts": 0, **staged}, records_read=1)
        with coord.store.db.transaction() as cur:  # the digest the commit takes, taken beside it, less the
            num = coord.store.load(cur, "bench_verify_out")[0]  # count the commit took before digests were
            staging, key = coord.store.out_staging(num), {"txid": txn.txid, "attempt": attempt.attempt}
            count = sql.SQL("SELECT output, count(*) FROM {} WHERE txid = %(txid)s AND attempt = %(attempt)s "
                            "GROUP BY output").format(staging)
            t0 = time.perf_counter()
            cur.execute(count, key)  # counted before and after, the digest between: no order favours it
            t1 = time.perf_counter()
            outputs.staged_counts(cur, staging, txn.txid, attempt.attempt)
            t2 = time.perf_counter()
            cur.execute(count, key)
            took = max(0.0, (t2 - t1) - ((t1 - t0) + (time.perf_counter() - t2)) / 2)
        t0 = time.perf_counter()
        coord.commit("bench_verify_out", txn.txid)
        if trial:  # the first warms up
            commits.append(time.perf_counter() - t0)
            shares.append(took)
    digest, commit = median(shares), median(commits)
    report.add(Row("verify", f"the commit's digest of its {EVENTS:,} output events (their hashes, beside the count "
                             "the commit took before), share of the commit that appends them",
                   f"{digest:.3f} s", f"{commit:.3f} s", digest / commit, "<= 0.05", digest / commit <= 0.05))


def run(dsn: str, sizes: Sizes, report: Report) -> None:
    del sizes  # one size: a few minutes
    with Coordinator(dsn) as coord:
        _event_digest(coord, report)
        _add_up(coord, report)
        _throughput(coord, dsn, report)
