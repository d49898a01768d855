"""The ``scale`` section of ``bench.perf``: how many transactions a minute one scheduler commits
when Spark has nothing to do -- empty batches, so what is measured is Airflow's cost per
transaction (three task processes, the scheduler's loops) and the state store's -- for one
topology, and for several at once, against the same three tasks as a plain DAG
(``bench/dags/bench_scale.py``). The docs' scaling model (docs/guides/cluster.md) is built on its
per-task times and CPU per transaction."""

from __future__ import annotations

import logging
import os
import statistics
from dataclasses import dataclass

from bench.harness import Harness
from bench.measure import (
    SCALE_NOOP,
    SCALE_TOPOLOGIES,
    CpuMeter,
    Row,
    parse_ts,
)
from bench.roles import RoleCpu

log = logging.getLogger("bench.perf")

NOOP = SCALE_NOOP
TOPOLOGIES = SCALE_TOPOLOGIES


def topology(i: int) -> str:
    return f"bench_scale_{i}"


@dataclass
class Rate:
    """What a set of runs achieved: runs (or commits) a minute, first start to the last end."""

    per_minute: float
    seconds: float
    cpu_per_run: float  # CPU-seconds of the whole machine per run
    busy: float
    task_seconds: dict[str, float]  # median duration of each task
    roles: str  # where the CPU went, by process role, per run


def finished(h: Harness, runs: dict[str, list[str]], *, commits: bool) -> tuple[int, float]:
    """How many ``runs`` (dag id -> run ids) there were and the seconds they took, all awaited: to
    the last commit when ``commits`` (the topologies' audit log), else to the last run's end."""
    done = {d: h.wait_runs(d, ids, timeout=180 + 30 * len(ids) * len(runs)) for d, ids in runs.items()}
    start = min(parse_ts(r["start_date"]) for rs in done.values() for r in rs)
    if commits:
        ends = []
        for d, ids in runs.items():
            made = h.commits(d, ids)
            assert len(made) == len(ids), f"{d}: {len(made)} commits of {len(ids)} runs"
            txids = [c["txid"] for c in sorted(made, key=lambda c: c["committed_at"])]
            assert txids == sorted(txids), f"{d}: commits out of txid order: {txids}"
            ends += [c["committed_at"] for c in made]
        end = max(ends)
    else:
        end = max(parse_ts(r["end_date"]) for rs in done.values() for r in rs)
    return sum(len(ids) for ids in runs.values()), (end - start).total_seconds()


def task_seconds(h: Harness, runs: dict[str, list[str]]) -> dict[str, float]:
    """The median duration of each task over the runs' task instances (as Airflow recorded them)."""
    durations: dict[str, list[float]] = {}
    for d, ids in runs.items():
        for run_id in ids:
            for ti in h.client.task_instances(d, run_id):
                if ti.get("duration") is not None:
                    durations.setdefault(ti["task_id"], []).append(float(ti["duration"]))
    return {task: statistics.median(v) for task, v in sorted(durations.items())}


def measure(h: Harness, dags: list[str], *, commits: bool) -> Rate:
    runs: dict[str, list[str]] = {d: [] for d in dags}
    with CpuMeter() as cpu, RoleCpu() as roles:
        for _ in range(h.sizes.scale_runs):  # interleaved: every topology has runs waiting from the start
            for d in dags:
                runs[d].append(h.trigger(d))
        n, seconds = finished(h, runs, commits=commits)
    # CPU-seconds of the whole machine a run: the cores' busy share over the runs' whole wait.
    rate = Rate(60 * n / seconds, seconds, cpu.busy * (os.cpu_count() or 1) * cpu.seconds / n, cpu.busy,
                task_seconds(h, runs), roles.text(n))
    log.info("scale: %s: %.1f a minute over %.0f s, %.1f CPU-s a run (%s), tasks %s", ", ".join(dags),
             rate.per_minute, rate.seconds, rate.cpu_per_run, rate.roles, rate.task_seconds)
    return rate


def _tasks(rate: Rate) -> str:
    return ", ".join(f"{task} {secs:.1f} s" for task, secs in rate.task_seconds.items())


def run(h: Harness) -> None:
    s = h.sizes
    noop = measure(h, [NOOP], commits=False)
    one = measure(h, [topology(0)], commits=True)
    h.report.add(Row(
        "scale", "CPU-seconds of the whole machine per transaction outside the Spark job (one topology, empty "
                 "batches: no Spark job) vs a run of the same three no-op tasks as a plain DAG",
        f"{one.cpu_per_run:.2f} CPU-s", f"{noop.cpu_per_run:.2f} CPU-s", one.cpu_per_run / noop.cpu_per_run,
        "<= 1.5 CPU-s", one.cpu_per_run <= 1.5,
        f"CPU-s a transaction by process: {one.roles}; a plain run: {noop.roles}"))
    h.report.add(Row(
        "scale", f"one topology, empty batches, max_in_flight=3: transactions a minute vs the same three no-op "
                 f"tasks as a plain DAG ({s.scale_runs} runs each)",
        f"{one.per_minute:.1f} txn/min", f"{noop.per_minute:.1f} runs/min", one.per_minute / noop.per_minute,
        "report", None,
        f"one topology: median task time {_tasks(one)}; {one.cpu_per_run:.1f} CPU-s a transaction, cores busy "
        f"{one.busy:.0%}; the plain DAG: {_tasks(noop)}; {noop.cpu_per_run:.1f} CPU-s a run, cores busy "
        f"{noop.busy:.0%}"))
    for k in s.scale_topologies:
        many = measure(h, [topology(i) for i in range(k)], commits=True)
        h.report.add(Row(
            "scale", f"{k} topologies at once, empty batches, max_in_flight=3 each: transactions a minute in all "
                     "vs one topology alone",
            f"{many.per_minute:.1f} txn/min ({many.per_minute / k:.1f} each)", f"{one.per_minute:.1f} txn/min",
            many.per_minute / one.per_minute, "report", None,
            f"{k} topologies: median task time {_tasks(many)}; {many.cpu_per_run:.1f} CPU-s a transaction, cores "
            f"busy {many.busy:.0%}; at one run a minute each, this scheduler keeps up with "
            f"{int(many.per_minute)} such topologies"))
