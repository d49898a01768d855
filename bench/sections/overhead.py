"""The ``overhead`` section of ``bench.perf``: an empty transaction (run start to committed) vs a
no-op 3-task DAG run on the same scheduler."""

from __future__ import annotations

from bench.harness import Harness
from bench.measure import Row, median, parse_ts


def run(h: Harness) -> None:
    ours, noop = [], []
    for _ in range(h.sizes.overhead_runs):
        run = h.trigger("bench_empty")
        r = h.wait_runs("bench_empty", [run], 300)[0]
        c = h.commits("bench_empty", [run])[0]
        ours.append((c["committed_at"] - parse_ts(r["start_date"])).total_seconds())
        run = h.trigger("bench_noop")
        r = h.wait_runs("bench_noop", [run], 300)[0]
        noop.append((parse_ts(r["end_date"]) - parse_ts(r["start_date"])).total_seconds())
    o, b = median(ours), median(noop)
    h.report.add(Row("overhead", "empty transaction, run start -> committed, vs no-op 3-task DAG run",
                        f"{o:.1f} s", f"{b:.1f} s", o / b, "<= 0.6x", o / b <= 0.6))
