"""The ``verify`` section of ``bench.perf``: what the shadow audit (``core/verify.py``) costs the
topology. N batches of the words job, each processed by a spark-submit and committed as the process
and commit tasks do (the baseline, audit off, run before and after the others), against the same
with the audit beside them as the verify task runs it -- after each commit its triage, and the job
on a verify round's request (``--recompute``) only when a txid is to be recomputed, one round at a
time, every txid or 1 in 10 of them -- on the same two cores: the throughput the audit leaves the
topology when it has no spare cores of its own, and how soon after the last commit every txid was
verified. Then what a round's add-up check (every state against its delta history) costs on a state
of many keys with a long history, against the commit of one batch; and what the digest of a
commit's output events costs that commit."""

from __future__ import annotations

import json
import logging
import os
import random
import resource
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from psycopg2 import sql

from airflow_transactional import OutputSpec, StateSpec, TopologySpec
from airflow_transactional.coordinator import Coordinator, VerificationRound
from airflow_transactional.core import attempts
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spark import cds
from airflow_transactional.spark.recompute import RECOMPUTE_ARG, deliver_request
from airflow_transactional.spark.submit import (
    VERIFY_NICENESS,
    provider_zip,
    spark_submit_argv,
    with_jit_for_batch,
    with_quiet_driver_logs,
)
from airflow_transactional.store import outputs
from bench.measure import DOMAINS, WORDS_JOB, Report, Row, Sizes, median, run_measured
from bench.sections.history import commit_deltas, counts_topology
from bench.sections.work import words_topology

log = logging.getLogger("bench.perf")

#: Batches of the throughput rows, their records, the txids a round checks at most, and how many
#: the verify task leaves to a later round when it checks every txid (``verify_lag``: rounds of 5).
TXIDS = 20
RECORDS = 50_000
ROUND = 10
LAG = 4
#: The add-up row: the keys of the state and the txids of history behind it (100,000 deltas each).
DRIFT_TXIDS = 20
#: The output-digest row: the events one commit appends, and its trials.
EVENTS = 100_000
DIGEST_TRIALS = 5


def _submit(coord: Coordinator, topology: str, mode: list[str], env: dict[str, str], batch: Mapping[str, Any],
            records: int) -> None:
    """One spark-submit of the words job on ``topology`` with the arguments ``mode`` (a txid, or a
    verify round's request), its driver's JIT chosen for ``batch`` of ``records`` as the process
    and verify tasks choose it."""
    conf = with_jit_for_batch(with_quiet_driver_logs({"spark.ui.enabled": "false"}), batch, records)
    niced = ["nice", "-n", str(VERIFY_NICENESS)] if RECOMPUTE_ARG in mode else []  # as the verify task starts it
    startup = cds.current()
    submit = spark_submit_argv("local[2]", cds.with_archive(conf, startup), "--name", f"verify-{topology}")
    argv = [*niced, *submit, "--py-files", provider_zip(), str(WORDS_JOB), "--topology", topology,
            "--schema", coord.schema, *mode]
    run_measured(argv, {**env, **cds.env_of(startup)}, f"verify: the words job on {topology} ({' '.join(mode)})")


class _Audit(threading.Thread):
    """The verify task's rounds beside the topology, as its DAG runs them: after each commit, the
    task's triage, and a job only when more than ``lag`` txids are to be recomputed (up to
    ``ROUND``, 1 in ``every``); one round at a time -- a commit that lands during a round waits for
    the next."""

    def __init__(self, dsn: str, topology: str, every: int, lag: int, env: dict[str, str]) -> None:
        super().__init__(name=f"audit-{topology}", daemon=True)
        self.dsn, self.topology, self.every, self.lag, self.env = dsn, topology, every, lag, env
        self.committed, self.done = threading.Event(), threading.Event()
        self.rounds, self.jobs, self.caught_up = 0, 0, 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Coordinator(self.dsn) as coord:
                while True:
                    self.committed.wait()
                    self.committed.clear()
                    last = self.done.is_set()
                    while True:  # rounds back to back while txids wait (after the last commit: all of them)
                        found = coord.verify_triage(self.topology, budget=ROUND, every=self.every,
                                                    lag=0 if last else self.lag)
                        self.rounds += 1
                        if not found["recompute"]:
                            break
                        asked = deliver_request(VerificationRound(self.topology, ROUND, self.every))
                        try:
                            _submit(coord, self.topology, asked.app_args, self.env, found["batch"], found["records"])
                        finally:
                            asked.remove()
                        self.jobs += 1
                    if last:
                        self.caught_up = time.perf_counter()
                        return
        except BaseException as exc:  # reported by the stream, which waits for it
            self.error = exc


def _stream(coord: Coordinator, dsn: str, topology: str, audit: tuple[int, int] | None, env: dict[str, str]
            ) -> tuple[float, float, float, _Audit | None]:
    """``TXIDS`` batches of ``topology`` planned, processed by a spark-submit each (its JIT chosen
    as the process task chooses it) and committed, one after another; with ``audit`` (1 in k, the
    lag), the verify task's rounds beside them. (CPU-s of everything, wall s to the last commit, s
    from it until the audit had checked every txid, the audit.)"""
    beside = _Audit(dsn, topology, *audit, env) if audit is not None else None
    if beside is not None:
        beside.start()
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    for i in range(TXIDS):
        txn = coord.plan(topology, f"r{i}")
        _submit(coord, topology, ["--txid", str(txn.txid)], env, txn.batch, txn.planned_records)
        coord.commit(topology, txn.txid)
        if beside is not None:
            beside.committed.set()
    wall, lag = time.perf_counter() - t0, 0.0
    if beside is not None:
        beside.done.set()
        beside.committed.set()
        beside.join()
        if beside.error is not None:
            raise beside.error
        lag = beside.caught_up - t0 - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), wall, lag, beside


def _throughput(coord: Coordinator, dsn: str, report: Report) -> None:
    events = EventLog(dsn, "bench_verify")
    events.create(2)
    rng = random.Random(7)
    for chunk in range(TXIDS):
        events.append([(f"v{chunk}-{i}", json.dumps({"url": f"https://{DOMAINS[rng.randrange(5)]}/p{rng.randrange(500)}",
                                                     "user": "u"})) for i in range(RECORDS)])
    events.close()
    env = {**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    # The audit off before and after the two with it: the machine's drift over the run, averaged out.
    configs = [("bench_verify_off", None), ("bench_verify_all", (1, LAG)), ("bench_verify_tenth", (10, 0)),
               ("bench_verify_off2", None)]
    runs = {}
    for name, sampling in configs:
        coord.register(replace(words_topology(name, PostgresLogSource("bench_verify"), RECORDS),
                               max_in_flight=TXIDS + 1))
        runs[name] = _stream(coord, dsn, name, sampling, env)
        log.info("verify: %s: %.1f CPU-s, %.1f s to the last commit, verified %.1f s after it", name, *runs[name][:3])
    for name, sampling in configs:
        if sampling is not None:
            status = coord.verify_status(name)
            assert status["verified_through"] == TXIDS and not status["counts"].get("failed"), status
    off_cpu = (runs["bench_verify_off"][0] + runs["bench_verify_off2"][0]) / 2
    off_wall = (runs["bench_verify_off"][1] + runs["bench_verify_off2"][1]) / 2
    for name, what, target in ((("bench_verify_all", f"every txid, verify_lag={LAG}", 0.8),
                                ("bench_verify_tenth", "1 in 10", 0.95))):
        cpu, wall, lag, audit = runs[name]
        assert audit is not None
        # Events per second until every txid was verified too, against without the audit: the
        # inverse of the times. (The last round, after the last commit, is in.)
        ratio = off_wall / (wall + lag)
        report.add(Row("verify", f"the topology's throughput with the shadow audit checking {what} beside it "
                                 f"(the verify task's rounds) vs off, until every txid is verified: {TXIDS} batches "
                                 f"of {RECORDS:,} events, spark-submit each",
                       f"{TXIDS * RECORDS / (wall + lag):,.0f} ev/s", f"{TXIDS * RECORDS / off_wall:,.0f} ev/s",
                       ratio, f">= {target}x", ratio >= target,
                       note=f"on the same two cores; {audit.jobs} verify jobs in {audit.rounds} rounds; the last "
                            f"commit {wall:.1f} s in, every txid verified {lag:.1f} s after it; CPU {cpu:.1f} vs "
                            f"{off_cpu:.1f} CPU-s; audit off before and after: {runs['bench_verify_off'][1]:.0f} "
                            f"s and {runs['bench_verify_off2'][1]:.0f} s"))


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
