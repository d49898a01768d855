"""The ``cluster`` section of ``bench.perf``: the same words topology on the benchmark's Airflow
(LocalExecutor, ``local[2]``: :func:`words_on`, while that Airflow runs) and then on the cluster
stack (``dev.cluster``: CeleryExecutor with two workers on Redis, a Spark standalone cluster of two
one-core workers: :func:`run`, after it stopped), on the same machine, with both final states
compared row by row."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass

from airflow_transactional.identifiers import qualified_table
from airflow_transactional.sources import EventLog
from airflow_transactional.spec import DEFAULT_STATE_SCHEMA
from bench.harness import Harness, cluster_entry
from bench.measure import CLUSTER_DAG, REPO, CpuMeter, Row, event_payload, execute
from dev.cluster import ClusterStack

log = logging.getLogger("bench.perf")


@dataclass
class Words:
    """What the words topology achieved on one stack: first run's start to the last commit."""

    events_per_second: float
    seconds: float
    busy: float
    state: list[tuple[object, ...]]  # its url_counts, ordered


def words_on(h: Harness) -> Words:
    """``cluster_transactions`` transactions of words (the same events on every stack: a seeded
    generator) through ``CLUSTER_DAG`` on ``h``'s running Airflow."""
    s = h.sizes
    rng = random.Random(17)
    el = EventLog(h.stack.state_dsn, CLUSTER_DAG)
    el.create(4)
    n = s.cluster_transactions * s.cluster_batch
    el.append([(f"c{i}", event_payload(rng, s.distinct_urls)) for i in range(n)])
    el.close()
    with CpuMeter() as cpu:
        runs = [h.trigger(CLUSTER_DAG) for _ in range(s.cluster_transactions)]
        rate, _, seconds = h.throughput(CLUSTER_DAG, runs, timeout=180 + 120 * s.cluster_transactions)
    table = ".".join(f'"{p}"' for p in qualified_table(f"{CLUSTER_DAG}_url_counts", DEFAULT_STATE_SCHEMA))
    state = execute(h.stack.state_dsn, f"SELECT url, value FROM {table} ORDER BY url")
    log.info("cluster: %s: %.0f events/s over %.0f s", type(h.stack).__name__, rate, seconds)
    return Words(rate, seconds, cpu.busy, state)


def run(h: Harness, local: Words) -> None:
    """The words topology on the cluster stack (started here, in ``h``'s directory, and removed),
    after ``local`` -- the same on ``h``'s Airflow -- and with that Airflow stopped."""
    s = h.sizes
    on = Harness(h.base / "cluster", s, h.report, h.sections)
    on.stack = ClusterStack(on.base, on.dags)
    on.dags.mkdir(parents=True)
    (on.dags / "bench_words.py").symlink_to(REPO / "bench" / "dags" / "bench_words.py")
    (on.dags / "bench_words.json").write_text(json.dumps([cluster_entry(s)]))
    try:
        on.stack.start()
        EventLog(on.stack.state_dsn, CLUSTER_DAG).create(4)
        on.settle([CLUSTER_DAG])
        cluster = words_on(on)
    finally:
        on.stack.stop(remove=True)
    same = cluster.state == local.state and bool(local.state)
    h.report.add(Row(
        "cluster", f"{s.cluster_transactions} txns x {s.cluster_batch:,} events of words, max_in_flight="
                   f"{s.max_in_flight}: CeleryExecutor (two workers) + a Spark standalone cluster (two one-core "
                   "workers) vs LocalExecutor + local[2], on this machine",
        f"{cluster.events_per_second:,.0f} ev/s ({cluster.seconds:.0f} s)",
        f"{local.events_per_second:,.0f} ev/s ({local.seconds:.0f} s)",
        cluster.events_per_second / local.events_per_second, "report", None,
        f"cores busy {cluster.busy:.0%} on the cluster stack, {local.busy:.0%} on the local one; final states "
        f"{'equal row by row' if same else 'DIFFER'} ({len(local.state):,} url counts)"))
    if not same:
        raise AssertionError(f"{CLUSTER_DAG}: the cluster stack's final state differs from the local one's")
