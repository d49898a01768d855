"""The ``waits`` section of ``bench.perf``: where a commit waits for txid-1, and what that costs.

K topologies (``words``), each with three transactions in flight: the first carries a batch that
keeps ``spark-submit`` busy for longer than ``defer_after``, the two after it are empty, so their
commits wait for it. Once with the default ``deferrable=True`` (after ``defer_after`` in the
worker, the waits are parked in Airflow's triggerer and woken by the commit's ``NOTIFY``), once
with ``deferrable=False`` (each waiting commit polls in a worker every second to the end), one
after the other on the same Airflow:

- worker slots held by commits: the most commit task instances *running* at any moment (polled
  every half second over REST), and how many were *deferred* meanwhile;
- commit latency after the predecessor commits: when each waiting txid's commit began minus its
  predecessor's ``committed_at``, median over the topologies (the NOTIFY, then the trigger
  committing the txid -- vs a poll in a worker that never left).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.sources import EventLog
from bench.measure import Row, event_payload

if TYPE_CHECKING:
    from bench.harness import Harness

MODES = {"deferred": True, "sleeping": False}
SAMPLE = 0.5  # seconds between looks at the commit tasks
# Per mode, each with max_in_flight = 3. Two, so that sleeping waits cannot starve the bench's
# six worker slots: two processing tasks + four sleeping commits fit. (With three, the sleeping
# commits can take the slots the last processing task and the first commits need: the starvation
# deferral removes, which tests/e2e/test_deferred_waits.py shows at four slots.)
TOPOLOGIES = 2
EVENTS = 60_000  # the first transaction's batch: ~20-30 s of spark-submit, longer than defer_after


def dags() -> list[dict[str, Any]]:
    """The section's entries of ``bench_words.json``."""
    # No spark pool: the empty transactions' process tasks must not queue behind the big batch
    # for a pool slot (then their commits would start only after it, and never wait).
    return [{"name": name(mode, k), "landing": None, "max_in_flight": 3, "batch": EVENTS, "connect": False,
             "deferrable": deferrable, "pool": None} for mode, deferrable in MODES.items() for k in range(TOPOLOGIES)]


def name(mode: str, k: int) -> str:
    return f"bench_waits_{mode}_{k}"


class Waits(NamedTuple):
    slot_seconds: float  # worker-slot seconds held by commits waiting for their predecessor
    deferred_seconds: float  # commit-seconds spent waiting in the triggerer instead
    most_held: int  # most waiting commits holding a worker slot at one moment
    latencies: list[float]  # predecessor committed -> this commit began, for commits seen waiting


def _sample(bench: Harness, coord: Coordinator, dag_ids: list[str], done: Callable[[], bool]
            ) -> tuple[float, float, int, set[tuple[str, int]]]:
    """Every half second until ``done()``: which commits wait for their predecessor, and where."""
    held = deferred = 0.0
    most = 0
    seen: set[tuple[str, int]] = set()
    txid_of: dict[tuple[str, str], int] = {}
    deadline = time.monotonic() + 900
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs of {dag_ids} unfinished after 900 s; see {bench.base / 'logs'}")
        tis = bench.client.post("/api/v2/dags/~/dagRuns/~/taskInstances/list",
                                {"dag_ids": dag_ids, "task_ids": ["commit"], "state": ["running", "deferred"],
                                 "page_limit": 100})["task_instances"]
        committed = {d: coord.status(d).committed_txid for d in dag_ids}
        holding = 0
        for ti in tis:
            key = (ti["dag_id"], ti["dag_run_id"])
            if key not in txid_of:
                txn = coord.transaction_for_run(*key)
                if txn is None:
                    continue
                txid_of[key] = txn.txid
            txid = txid_of[key]
            if txid <= committed[ti["dag_id"]] + 1:
                continue  # its turn: committing, not waiting
            seen.add((ti["dag_id"], txid))
            if ti["state"] == "running":
                holding += 1
                held += SAMPLE
            else:
                deferred += SAMPLE
        most = max(most, holding)
        time.sleep(SAMPLE)
    return held, deferred, most, seen


def _one_mode(bench: Harness, mode: str, rng: random.Random) -> Waits:
    dag_ids = [name(mode, k) for k in range(TOPOLOGIES)]
    for dag_id in dag_ids:
        log = EventLog(bench.stack.state_dsn, dag_id)
        log.append([(f"w{i}", event_payload(rng, bench.sizes.distinct_urls)) for i in range(EVENTS)])
        log.close()
    runs = {dag_id: [bench.trigger(dag_id) for _ in range(3)] for dag_id in dag_ids}

    def done() -> bool:
        return all(bench.client.run(d, r)["state"] in ("success", "failed") for d in dag_ids for r in runs[d])

    coord = Coordinator(bench.stack.state_dsn)
    try:
        held, deferred, most, seen = _sample(bench, coord, dag_ids, done)
        latencies = []
        for dag_id in dag_ids:
            bench.wait_runs(dag_id, runs[dag_id], timeout=60)
            commits = {c["txid"]: c for c in coord.commits(dag_id)}
            latencies += [(commits[t]["commit_started_at"] - commits[t - 1]["committed_at"]).total_seconds()
                          for d, t in seen if d == dag_id]
    finally:
        coord.close()
    return Waits(held, deferred, most, latencies)


def run(bench: Harness) -> None:
    rng = random.Random(5)
    deferred, sleeping = (_one_mode(bench, mode, rng) for mode in MODES)
    what = f"{TOPOLOGIES} topologies x 3 in flight, 2 commits each waiting for a {EVENTS:,}-event batch"
    bench.report.add(Row(
        "waits", f"worker-slot seconds held by commits waiting for their predecessor, deferrable vs sleeping ({what})",
        f"{deferred.slot_seconds:.0f} slot-s (at most {deferred.most_held} at once; "
        f"{deferred.deferred_seconds:.0f} s deferred)",
        f"{sleeping.slot_seconds:.0f} slot-s (at most {sleeping.most_held} at once)",
        deferred.slot_seconds / sleeping.slot_seconds if sleeping.slot_seconds else None, "< 1x",
        deferred.slot_seconds < sleeping.slot_seconds,
        f"a waiting commit holds its slot for defer_after (10 s), then waits in the triggerer; sampled every "
        f"{SAMPLE} s"))
    d_lat, s_lat = deferred.latencies, sleeping.latencies
    if d_lat and s_lat:
        d_med, s_med = statistics.median(d_lat), statistics.median(s_lat)
        bench.report.add(Row(
            "waits", "a waiting commit's start after its predecessor committed, median: NOTIFY + the commit in "
                     "the triggerer (deferrable) vs polling every second in a worker",
            f"{d_med:.1f} s (max {max(d_lat):.1f}, n={len(d_lat)})", f"{s_med:.1f} s (max {max(s_lat):.1f}, "
            f"n={len(s_lat)})", d_med / s_med if s_med else None, "report", None,
            "the trigger wakes within milliseconds of the commit and commits its txid; the task resumes after "
            "it, to send the asset events and metrics"))
