"""The ``commit`` section of ``bench.perf``, on the state store alone: committing D staged deltas
vs a hand-written bulk ``INSERT ... ON CONFLICT`` of rows of the same shape into the same table;
and the commit on a large state vs a small one."""

from __future__ import annotations

import io
import logging
import random
import time

import psycopg2

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import attempts
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from bench.measure import Report, Row, Sizes, execute, md5, median

log = logging.getLogger("bench.perf")


def commit_rows(existing: int, prefix: str, n: int, rng: random.Random) -> list[tuple[str, int]]:
    """``n`` delta rows: half update keys already in the state, half are new keys."""
    updates = [(md5(f"s{i}"), 1) for i in rng.sample(range(1, existing + 1), min(existing, n // 2))]
    return updates + [(md5(f"{prefix}-{j}"), 1) for j in range(n - len(updates))]


def commit_trials(coord: Coordinator, dsn: str, topo: str, target: str, n_state: int, sizes: Sizes,
                  rng: random.Random) -> tuple[list[float], list[float]]:
    """Seconds per commit of ours and of the hand-written upsert, trial by trial."""
    ours: list[float] = []
    base: list[float] = []
    committed = [0]

    def ours_once(trial: int) -> float:
        txn = coord.plan(topo, f"trial-{trial}")
        attempt, txn = attempts.begin_attempt(coord.store, topo, txn.txid)
        n = coord.stage(attempt, "counts", commit_rows(n_state, f"o{trial}", sizes.commit_delta, rng))
        attempts.finish_attempt(coord.store, attempt, {"counts": n}, records_read=1)
        t0 = time.perf_counter()
        coord.commit(topo, txn.txid)
        took = time.perf_counter() - t0
        committed.append(txn.txid)
        return took

    def baseline_once(trial: int) -> float:
        """The physical limit: as many rows, of the same shape, already in Postgres, upserted
        into the same table by one hand-written statement (stamped with a committed txid)."""
        buf = io.StringIO("".join(f"{k}\t{v}\n" for k, v in
                                  commit_rows(n_state, f"b{trial}", sizes.commit_delta, rng)))
        conn = psycopg2.connect(dsn)
        try:
            with conn, conn.cursor() as cur:
                cur.execute("DROP TABLE IF EXISTS bench_delta")
                cur.execute("CREATE TABLE bench_delta (k text, value bigint)")
                cur.copy_expert("COPY bench_delta FROM STDIN", buf)
                cur.execute("ANALYZE bench_delta")
            t0 = time.perf_counter()
            with conn, conn.cursor() as cur:
                cur.execute(f"INSERT INTO {target} AS t (k, value, txid) SELECT k, value, %s FROM bench_delta "
                            "ON CONFLICT (k) DO UPDATE SET value = t.value + EXCLUDED.value, "
                            "txid = EXCLUDED.txid", (committed[-1],))
            return time.perf_counter() - t0
        finally:
            conn.close()

    # Trial 0 warms the caches for both and is not counted; the order alternates.
    for trial in range(sizes.commit_trials + 1):
        first, second = (ours_once, baseline_once) if trial % 2 == 0 else (baseline_once, ours_once)
        a, b = first(trial), second(trial)
        if trial:
            ours.append(a if first is ours_once else b)
            base.append(b if first is ours_once else a)
    return ours, base


def run(dsn: str, sizes: Sizes, report: Report) -> None:
    coord = Coordinator(dsn)
    events = EventLog(dsn, "bench_commit")
    events.create(1)
    events.append([(f"c{i}", "{}") for i in range(4 * sizes.commit_trials)])
    rng = random.Random(3)
    medians: dict[str, tuple[float, float]] = {}
    try:
        for label, n_state in (("small", sizes.commit_small_state), ("large", sizes.commit_large_state)):
            topo = f"bench_commit_{label}"
            state = StateSpec("counts", keys={"k": "text"}, combiner="count", table=topo)
            coord.register(TopologySpec(topo, PostgresLogSource("bench_commit"), [state],
                                        max_in_flight=1000, max_batch_size=1))
            target = ".".join(f'"{part}"' for part in state.schema_and_table)
            log.info("commit: filling %s with %d rows", target, n_state)
            execute(dsn, f"TRUNCATE {target}",
                    f"INSERT INTO {target} (k, value, txid) SELECT md5('s' || i), 1, 0 "
                    f"FROM generate_series(1, {n_state}) i")
            execute(dsn, f"VACUUM ANALYZE {target}", autocommit=True)
            ours, base = commit_trials(coord, dsn, topo, target, n_state, sizes, rng)
            medians[label] = (median(ours), median(base))
            o, b = medians[label]
            report.add(Row("commit", f"{sizes.commit_delta:,} deltas into a {n_state:,}-row state vs bulk upsert",
                           f"{o:.3f} s", f"{b:.3f} s", b / o, ">= 0.8x", b / o >= 0.8))
        small, large = medians["small"][0], medians["large"][0]
        report.add(Row("commit", f"commit time, state {sizes.commit_large_state:,} vs "
                                 f"{sizes.commit_small_state:,} rows",
                       f"{large:.3f} s", f"{small:.3f} s", large / small, "<= 1.3", large / small <= 1.3))
    finally:
        coord.close()
        events.close()
