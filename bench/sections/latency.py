"""The ``latency`` section of ``bench.perf``: end-to-end latency of the payments pipeline, from a
request's append to the moment stage 2 (``settlement``) has committed its outcome -- the row of
the request in ``statements`` -- at a steady rate, on a real Airflow.

The chaos harness's payments mode without faults drives it (``bench/chaos``): producers append
at a steady rate, runs of stage 1 are triggered as in-flight slots free up (what a schedule tight
enough for the rate would do), each commit's ledger asset event starts a stage 2 run. A thread
polls ``statements`` and notes when each request first shows; the producers' ledger has when
each was appended. The invariants of ``dev/payments.py`` are checked at the end, as in chaos.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import psycopg2

from bench.chaos import Chaos, ChaosConfig, chaos_stack
from bench.measure import Row
from dev import payments

log = logging.getLogger(__name__)


class Seen(threading.Thread):
    """When each request id first shows in ``statements`` (polled every ``interval`` seconds)."""

    def __init__(self, dsn: str, interval: float = 0.25) -> None:
        super().__init__(name="latency-watch", daemon=True)
        self.dsn, self.interval = dsn, interval
        self.at: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        conn = None
        while not self.stop.wait(self.interval):
            try:
                if conn is None:
                    conn = psycopg2.connect(self.dsn)
                    conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute("SELECT DISTINCT request FROM statements")
                    now = time.time()
                    for (request,) in cur.fetchall():
                        self.at.setdefault(request, now)
            except psycopg2.Error:  # statements does not exist yet (stage 2 not registered)
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()


def percentile(xs: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``xs``, nearest rank."""
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def measure(base: Path, transactions: int, producers: int = 2, rate: int = 6) -> dict[str, Any]:
    """Run stage 1 for ``transactions`` runs while ``producers`` x ``rate`` requests per second
    are appended; the latencies (seconds) of every request decided (granted or declined)."""
    cfg = ChaosConfig(mode="payments", transactions=transactions, faults=0, kinds=(), producers=producers,
                      rate=rate, duplicate_rate=0, malformed_rate=0, audit=False, drain_timeout=600)
    stack = chaos_stack(base, cfg)
    try:
        stack.start()
        watch = Seen(stack.state_dsn)
        watch.start()
        chaos = Chaos(stack, cfg)
        report = chaos.run()
        watch.stop.set()
        watch.join(10)
    finally:
        stack.stop()
    appended = chaos.ledger.appended_at
    due = [r for r, req in chaos.ledger.valid.items() if payments.valid(req)]  # the invalid are quarantined
    latencies = [watch.at[r] - appended[r] for r in due if r in watch.at]
    return {"latencies": latencies, "requests": len(due), "rate": producers * rate,
            "violations": report.violations, "table": report.table()}


def run(base: Path, sizes: Any, report: Any) -> None:
    got = measure(base, sizes.latency_transactions)
    lat = got["latencies"]
    if not lat:
        report.add(Row("latency", "payments end to end", "no request reached stage 2", "", None,
                       note=got["table"]))
        return
    p50, p99 = statistics.median(lat), percentile(lat, 0.99)
    note = "" if got["violations"] == 0 else "INVARIANTS VIOLATED: " + got["table"]
    report.add(Row("latency", f"payments: request appended -> its outcome in stage 2's state, p50 / p99, "
                   f"{got['rate']} requests/s, {len(lat)} requests", f"{p50:.1f} s / {p99:.1f} s", "", None,
                   note=note))
    if len(lat) < got["requests"]:
        log.warning("latency: %d of %d requests never showed in statements", got["requests"] - len(lat),
                    got["requests"])
