"""The ``waits`` section of ``bench.perf``: where a commit waits for txid-1, and what that costs.

K topologies (``words``), each with three transactions in flight: the first carries a batch that
keeps ``spark-submit`` busy, the two after it are empty, so their commits wait for it. Once with
the default ``deferrable=True`` (the waits are parked in Airflow's triggerer and woken by the
commit's ``NOTIFY``), once with ``deferrable=False`` (each waiting commit polls in a worker every
second), one after the other on the same Airflow:

- worker slots held by commits: the most commit task instances *running* at any moment (polled
  every half second over REST), and how many were *deferred* meanwhile;
- commit latency after the predecessor commits: ``committed_at`` of each waiting txid minus its
  predecessor's, median over the topologies (the NOTIFY, then Airflow resuming the task in a
  worker -- vs a poll in a worker that never left).
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.sources import EventLog

if TYPE_CHECKING:
    from bench.perf import Bench

MODES = {"deferred": True, "sleeping": False}
# Per mode, each with max_in_flight = 3. Two, so that sleeping waits cannot starve the bench's
# six worker slots: two processing tasks + four sleeping commits fit. (With three, the sleeping
# commits can take the slots the last processing task and the first commits need: the starvation
# deferral removes, which tests/e2e/test_deferred_waits.py shows at four slots.)
TOPOLOGIES = 2
EVENTS = 20_000  # the first transaction's batch: ~10-20 s of spark-submit


def dags() -> list[dict[str, Any]]:
    """The section's entries of ``bench_words.json``."""
    return [{"name": name(mode, k), "landing": None, "max_in_flight": 3, "batch": EVENTS, "connect": False,
             "deferrable": deferrable} for mode, deferrable in MODES.items() for k in range(TOPOLOGIES)]


def name(mode: str, k: int) -> str:
    return f"bench_waits_{mode}_{k}"


def _peaks(bench: Bench, dag_ids: list[str], done: Callable[[], bool]) -> tuple[int, int]:
    """(most commit task instances running at once, most deferred at once) until ``done()``."""
    running = deferred = 0
    deadline = time.monotonic() + 900
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs of {dag_ids} unfinished after 900 s; see {bench.base / 'logs'}")
        tis = bench.client.post("/api/v2/dags/~/dagRuns/~/taskInstances/list",
                                {"dag_ids": dag_ids, "task_ids": ["commit"], "state": ["running", "deferred"],
                                 "page_limit": 100})["task_instances"]
        running = max(running, sum(ti["state"] == "running" for ti in tis))
        deferred = max(deferred, sum(ti["state"] == "deferred" for ti in tis))
        time.sleep(0.5)
    return running, deferred


def _one_mode(bench: Bench, mode: str, rng: random.Random) -> tuple[int, int, list[float]]:
    from bench.perf import event_payload

    dag_ids = [name(mode, k) for k in range(TOPOLOGIES)]
    for dag_id in dag_ids:
        log = EventLog(bench.stack.state_dsn, dag_id)
        log.append([(f"w{i}", event_payload(rng, bench.sizes.distinct_urls)) for i in range(EVENTS)])
        log.close()
    runs = {dag_id: [bench.trigger(dag_id) for _ in range(3)] for dag_id in dag_ids}

    def done() -> bool:
        return all(bench.client.run(d, r)["state"] in ("success", "failed") for d in dag_ids for r in runs[d])

    running, deferred = _peaks(bench, dag_ids, done)
    latencies = []
    coord = Coordinator(bench.stack.state_dsn)
    try:
        for dag_id in dag_ids:
            bench.wait_runs(dag_id, runs[dag_id], timeout=60)
            commits = sorted((c for c in coord.commits(dag_id) if c["run_key"] in runs[dag_id]),
                             key=lambda c: c["txid"])
            assert len(commits) == 3 and [c["records_read"] for c in commits][1:] == [0, 0], (dag_id, commits)
            latencies += [(b["committed_at"] - a["committed_at"]).total_seconds()
                          for a, b in itertools.pairwise(commits)]
    finally:
        coord.close()
    return running, deferred, latencies


def bench_waits(bench: Bench) -> None:
    from bench.perf import Row

    rng = random.Random(5)
    result = {mode: _one_mode(bench, mode, rng) for mode in MODES}
    (d_run, d_def, d_lat), (s_run, s_def, s_lat) = result["deferred"], result["sleeping"]
    what = f"{TOPOLOGIES} topologies x 3 in flight, 2 commits each waiting for a {EVENTS:,}-event batch"
    bench.report.add(Row(
        "waits", f"most commit tasks holding a worker slot at once, deferrable vs sleeping ({what})",
        f"{d_run} running, {d_def} deferred", f"{s_run} running, {s_def} deferred",
        d_run / s_run if s_run else None, "fewer", d_run < s_run,
        "a deferred commit runs in a worker only to commit; waiting, it is in the triggerer"))
    d_med, s_med = statistics.median(d_lat), statistics.median(s_lat)
    bench.report.add(Row(
        "waits", "commit latency after the predecessor commits, median: NOTIFY wake-up + resume in a worker "
                 "vs polling every second in a worker",
        f"{d_med:.1f} s (max {max(d_lat):.1f})", f"{s_med:.1f} s (max {max(s_lat):.1f})",
        d_med / s_med if s_med else None, "report", None,
        "the trigger wakes within milliseconds of the commit; the rest is Airflow scheduling the resumed "
        "task and starting its worker process"))
