"""The ``plan`` section of ``bench.perf``, on the state store alone: planning a batch on a large
event log vs the same on a small one."""

from __future__ import annotations

import logging
import time

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from bench.measure import SCHEMA, Report, Row, Sizes, execute, median, settle_log

log = logging.getLogger("bench.perf")


def fill_log(dsn: str, name: str, n: int, partitions: int = 4) -> None:
    """Put ``n`` events into a log directly (setup, not what is measured), in chunks."""
    EventLog(dsn, name).create(partitions)
    chunk = 2_000_000
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        execute(dsn, f"INSERT INTO {SCHEMA}.log_events (log_name, partition, lsn, event_id, payload) "
                     f"SELECT '{name}', i % {partitions}, i / {partitions} + 1, 'e' || i, "
                     "'{\"url\": \"https://example.com/p/' || (i % 1000) || '\"}' "
                     f"FROM generate_series({lo}, {hi - 1}) i")
    settle_log(dsn, SCHEMA, name)


def run(dsn: str, sizes: Sizes, report: Report) -> None:
    coord = Coordinator(dsn)
    times: dict[int, float] = {}
    try:
        for n in (sizes.plan_small_log, sizes.plan_large_log):
            name = f"bench_plan_{n}"
            log.info("plan: filling log %s with %d events", name, n)
            fill_log(dsn, name, n)
            topo = f"bench_plan_{n}"
            coord.register(TopologySpec(topo, PostgresLogSource(name),
                                        [StateSpec("c", keys={"k": "text"}, combiner="count", table=topo)],
                                        max_in_flight=10_000, max_batch_size=10_000))
            took = []
            for i in range(sizes.plan_trials):
                t0 = time.perf_counter()
                txn = coord.plan(topo, f"run-{i}")
                took.append(time.perf_counter() - t0)
                assert txn.planned_records == 10_000, txn
            times[n] = median(took)
            log.info("plan: %s-event log: %s ms", f"{n:,}", " ".join(f"{t * 1000:.1f}" for t in took))
        small, large = times[sizes.plan_small_log], times[sizes.plan_large_log]
        report.add(Row("plan", f"plan a 10k batch, log of {sizes.plan_large_log:,} vs {sizes.plan_small_log:,} events",
                       f"{large * 1000:.1f} ms", f"{small * 1000:.1f} ms", large / small, "<= 1.5",
                       large / small <= 1.5))
    finally:
        coord.close()
