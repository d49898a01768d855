"""The ``history`` section of ``bench.perf``, on the state store alone: what the delta history costs
-- a commit with a long history kept vs none, the digest's share of a commit, the bytes per million
deltas -- what a state as of a txid costs to read, a correction of N txids vs processing them again
(pure-Python, and the words job under spark-submit), and what a correction's events cost the next
stage when it has an output log of its own."""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from dataclasses import replace
from typing import Any

from airflow_transactional import OutputEvent, OutputSpec
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import attempts
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spark import cds
from airflow_transactional.spark.submit import provider_zip, spark_submit_argv, with_quiet_driver_logs
from airflow_transactional.spec import StateSpec, TopologySpec
from airflow_transactional.store import history
from bench.measure import DOMAINS, WORDS_JOB, Report, Row, Sizes, md5, median, run_measured
from bench.sections.work import words_topology

log = logging.getLogger("bench.perf")

#: The deltas one commit applies, and the keys they update (the same keys every time: the state's size stays).
DELTAS = 100_000
#: How many txids of history the long-history topology keeps (quick: fewer).
HISTORY_TXIDS = 20
#: A correction's range, and the records each of its txids read.
CORRECTED_TXIDS = 10
RECORDS_PER_TXID = 5_000
#: The events of the first stage of the cascade row, each retracted and versioned by its correction.
CASCADE_EVENTS = 20_000
#: The same on Spark: fewer txids (a spark-submit each), more records each.
SPARK_TXIDS = 4
SPARK_RECORDS = 50_000


def counts_topology(coord: Coordinator, name: str, log_name: str) -> None:
    coord.register(TopologySpec(name, PostgresLogSource(log_name),
                                [StateSpec("counts", keys={"k": "text"}, combiner="count", table=name)],
                                max_in_flight=1000, max_batch_size=1))


def commit_deltas(coord: Coordinator, topology: str, run_key: str) -> float:
    """Stage ``DELTAS`` deltas as one attempt and commit them; the commit's seconds."""
    txn = coord.plan(topology, run_key)
    attempt, txn = attempts.begin_attempt(coord.store, topology, txn.txid)
    n = coord.stage(attempt, "counts", [(md5(f"k{i}"), 1) for i in range(DELTAS)])
    attempts.finish_attempt(coord.store, attempt, {"counts": n}, records_read=1)
    t0 = time.perf_counter()
    coord.commit(topology, txn.txid)
    return time.perf_counter() - t0


def _cost_per_commit(coord: Coordinator, sizes: Sizes, report: Report) -> None:
    kept = HISTORY_TXIDS if sizes.commit_trials > 2 else HISTORY_TXIDS // 4
    for name in ("bench_history_none", "bench_history_long"):
        counts_topology(coord, name, "bench_history")
        commit_deltas(coord, name, "warm")
    log.info("history: %d commits of %d deltas into the long history", kept, DELTAS)
    for i in range(kept):
        commit_deltas(coord, "bench_history_long", f"fill-{i}")
    none: list[float] = []
    long: list[float] = []
    digests: list[float] = []
    for trial in range(sizes.commit_trials + 1):
        coord.compact_history("bench_history_none", 0)  # none kept but the snapshot
        pair = [("none", "bench_history_none"), ("long", "bench_history_long")]
        for label, topo in pair if trial % 2 == 0 else reversed(pair):
            took = commit_deltas(coord, topo, f"trial-{trial}")
            if trial:
                (none if label == "none" else long).append(took)
        state = coord.spec("bench_history_long").states[0]
        txid = coord.status("bench_history_long").committed_txid
        [commit] = coord.commits("bench_history_long", txid)
        with coord.store.db.transaction() as cur:  # the digest the commit took, taken again
            num = coord.store.load(cur, "bench_history_long")[0]
            t0 = time.perf_counter()
            history.digest(cur, state, coord.store.staging(num, state), txid, commit["attempt"])
            digests.append(time.perf_counter() - t0)
    o, b = median(long), median(none)
    deltas = coord.history_sizes("bench_history_long")["counts"]
    report.add(Row("history", f"commit of {DELTAS:,} deltas with {deltas.deltas:,} deltas of history kept vs none",
                   f"{o:.3f} s", f"{b:.3f} s", o / b, "<= 1.1x", o / b <= 1.1))
    share = median(digests[1:]) / o
    report.add(Row("history", f"the commit's digest of its {DELTAS:,} deltas, share of the commit",
                   f"{median(digests[1:]):.3f} s", f"{o:.3f} s", share, "<= 0.1", share <= 0.1))
    per_million = deltas.bytes / deltas.deltas * 1e6 / 2**20
    report.add(Row("history", "space the history takes per million deltas (its staging table, indexes included)",
                   f"{per_million:.0f} MiB", "-", None,
                   note=f"{deltas.deltas:,} deltas in {deltas.bytes / 2**20:.0f} MiB"))
    _as_of(coord, report)


def _as_of(coord: Coordinator, report: Report) -> None:
    """The state as of the last txid from the history vs reading the state table."""
    txid = coord.status("bench_history_long").committed_txid
    t0 = time.perf_counter()
    rows = coord.state_as_of("bench_history_long", "counts", txid - 1)
    as_of = time.perf_counter() - t0
    with coord.store.db.transaction() as cur:
        t0 = time.perf_counter()
        cur.execute('SELECT k, value FROM "bench_history_long" ORDER BY k')
        plain = cur.fetchall()
        read = time.perf_counter() - t0
    assert len(rows) == len(plain), (len(rows), len(plain))
    report.add(Row("history", f"the state as of a txid ({len(rows):,} keys) from the history vs reading the table",
                   f"{as_of:.3f} s", f"{read:.3f} s", as_of / read, note="a lookup folds every delta kept"))


def _fn(rec: dict[str, object]) -> list[tuple[str, tuple[object, ...], object]]:
    return [("counts", (rec["k"],), 1)]


def _correction(coord: Coordinator, dsn: str, report: Report) -> None:
    """A correction of N committed txids (one batch of their records, the difference committed)
    vs processing and committing the same N batches again, on the pure-Python processor."""
    events = EventLog(dsn, "bench_correct")
    events.create(1)
    rng = random.Random(5)
    events.append([(f"c{i}", json.dumps({"k": f"k{rng.randrange(2_000)}"}))
                   for i in range(CORRECTED_TXIDS * RECORDS_PER_TXID)])
    events.close()
    for name in ("bench_correct", "bench_reprocess"):
        coord.register(TopologySpec(name, PostgresLogSource("bench_correct"),
                                    [StateSpec("counts", keys={"k": "text"}, combiner="count", table=name)],
                                    max_in_flight=CORRECTED_TXIDS + 1, max_batch_size=RECORDS_PER_TXID))
    for i in range(CORRECTED_TXIDS):
        txn = coord.plan("bench_correct", f"r{i}")
        process_batch(coord, "bench_correct", txn.txid, _fn)
        coord.commit("bench_correct", txn.txid)
    t0 = time.perf_counter()
    for i in range(CORRECTED_TXIDS):
        txn = coord.plan("bench_reprocess", f"r{i}")
        process_batch(coord, "bench_reprocess", txn.txid, _fn)
        coord.commit("bench_reprocess", txn.txid)
    again = time.perf_counter() - t0
    t0 = time.perf_counter()
    fix = coord.plan_correction("bench_correct", "fix", 1, CORRECTED_TXIDS)
    process_batch(coord, "bench_correct", fix.txid, _fn)
    coord.commit("bench_correct", fix.txid)
    took = time.perf_counter() - t0
    report.add(Row("history", f"a correction of {CORRECTED_TXIDS} txids ({RECORDS_PER_TXID:,} records each) vs "
                              "processing them again", f"{took:.2f} s", f"{again:.2f} s", took / again, "<= 1.2x",
                   took / again <= 1.2))


def _spark_txid(coord: Coordinator, topology: str, txid: int, env: dict[str, str]) -> tuple[float, float]:
    """(CPU-s, wall s) of the words job on ``txid`` under spark-submit, and of its commit."""
    t0 = time.perf_counter()
    startup = cds.current()
    conf = cds.with_archive(with_quiet_driver_logs({"spark.ui.enabled": "false"}), startup)
    argv = [*spark_submit_argv("local[2]", conf, "--name", f"history-{topology}-{txid}"), "--py-files",
            provider_zip(), str(WORDS_JOB), "--topology", topology, "--txid", str(txid), "--schema", coord.schema]
    cpu, _wall = run_measured(argv, {**env, **cds.env_of(startup)}, f"history: the words job on {topology} txid {txid}")
    coord.commit(topology, txid)
    return cpu, time.perf_counter() - t0


def _spark_correction(coord: Coordinator, dsn: str, report: Report) -> None:
    """The same on Spark: a correction of N txids (one spark-submit of the words job over their merged
    batch, the difference committed) vs processing and committing the N batches again (N spark-submits,
    as clearing their runs would)."""
    events = EventLog(dsn, "bench_correct_spark")
    events.create(2)
    rng = random.Random(6)
    events.append([(f"s{i}", json.dumps({"url": f"https://{DOMAINS[rng.randrange(5)]}/p{rng.randrange(500)}",
                                         "user": "u"})) for i in range(SPARK_TXIDS * SPARK_RECORDS)])
    events.close()
    env = {**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    for name in ("bench_correct_spark", "bench_reprocess_spark"):
        spec = words_topology(name, PostgresLogSource("bench_correct_spark"), SPARK_RECORDS)
        coord.register(replace(spec, max_in_flight=SPARK_TXIDS + 1))
    again = [0.0, 0.0]
    for i in range(SPARK_TXIDS):
        _spark_txid(coord, "bench_correct_spark", coord.plan("bench_correct_spark", f"r{i}").txid, env)
        cpu, wall = _spark_txid(coord, "bench_reprocess_spark", coord.plan("bench_reprocess_spark", f"r{i}").txid, env)
        again = [again[0] + cpu, again[1] + wall]
    cpu, wall = _spark_txid(coord, "bench_correct_spark",
                            coord.plan_correction("bench_correct_spark", "fix", 1, SPARK_TXIDS).txid, env)
    report.add(Row("history", f"a correction of {SPARK_TXIDS} txids ({SPARK_RECORDS:,} records each) on Spark vs "
                              "processing them again (CPU-s of the spark-submits; wall time with the commits)",
                   f"{cpu:.1f} CPU-s ({wall:.1f} s)", f"{again[0]:.1f} CPU-s ({again[1]:.1f} s)", cpu / again[0],
                   "<= 1.2x", cpu / again[0] <= 1.2))


def _relay(rec: dict[str, Any]) -> list[Any]:
    return [("counts", (rec["k"],), 1), OutputEvent("out", {"k": rec["k"], "n": rec["n"]}, key=str(rec["k"]))]


def _timed_batch(coord: Coordinator, topology: str, run_key: str) -> float:
    """Process and commit the next batch of ``topology`` (pure-Python); its seconds."""
    t0 = time.perf_counter()
    txn = coord.plan(topology, run_key)
    process_batch(coord, topology, txn.txid, _relay)
    coord.commit(topology, txn.txid)
    return time.perf_counter() - t0


def _cascade(coord: Coordinator, dsn: str, report: Report) -> None:
    """A next stage with an output log of its own reading a correction's events -- a retraction and
    a new version of each of N events it had read, so its events are retracted and versioned in
    turn -- vs the same stage reading 2N plain events (pure-Python processing and the commit)."""
    source = EventLog(dsn, "bench_cascade_src")
    source.create(1)
    source.append([(f"e{i}", json.dumps({"k": f"k{i % 2_000}", "n": i})) for i in range(CASCADE_EVENTS)])
    source.close()
    plain = EventLog(dsn, "bench_cascade_plain")
    plain.create(2)
    plain.append([(f"p{i}", json.dumps({"k": f"k{i % 2_000}", "n": i})) for i in range(2 * CASCADE_EVENTS)])
    plain.close()
    for name, read in (("bench_cascade_first", "bench_cascade_src"), ("bench_cascade_next", "bench_cascade_first"),
                       ("bench_cascade_same", "bench_cascade_plain")):
        state = StateSpec("counts", keys={"k": "text"}, table=name)
        coord.register(TopologySpec(name, PostgresLogSource(read), [state], max_batch_size=2 * CASCADE_EVENTS,
                                    outputs=[OutputSpec("out", log=name, partitions=2)]))
    _timed_batch(coord, "bench_cascade_first", "r")
    _timed_batch(coord, "bench_cascade_next", "r")
    fix = coord.plan_correction("bench_cascade_first", "fix", 1, 1)
    process_batch(coord, "bench_cascade_first", fix.txid, lambda rec: _relay({**rec, "n": -1}))
    coord.commit("bench_cascade_first", fix.txid)
    took = _timed_batch(coord, "bench_cascade_next", "fix")
    base = _timed_batch(coord, "bench_cascade_same", "r")
    with coord.store.db.transaction() as cur:  # each retraction taken back, each version counted
        cur.execute('SELECT count(*) FROM "bench_cascade_next" n JOIN "bench_cascade_first" f USING (k) '
                    "WHERE n.value = f.value")
        assert cur.fetchone()[0] == 2_000
    report.add(Row("history", f"the next stage's batch of a correction's {2 * CASCADE_EVENTS:,} events, its own events "
                              "retracted and versioned in turn, vs a batch of as many plain events",
                   f"{took:.2f} s", f"{base:.2f} s", took / base,
                   note="every event it had read retracted and versioned (the worst case): its commit records each "
                        "retraction and version in log_versions and rewrites its staged events"))


def run(dsn: str, sizes: Sizes, report: Report) -> None:
    coord = Coordinator(dsn)
    events = EventLog(dsn, "bench_history")
    events.create(1)
    events.append([(f"h{i}", "{}") for i in range(4 * (HISTORY_TXIDS + sizes.commit_trials + 2))])
    events.close()
    try:
        _cost_per_commit(coord, sizes, report)
        _correction(coord, dsn, report)
        _cascade(coord, dsn, report)
        _spark_correction(coord, dsn, report)
    finally:
        coord.close()
