"""The ``decisions`` section of ``bench.perf``: the cost of deciding in the commit -- a commit
whose batch of requests is decided per key in source order (``DecisionSpec``) vs a plain commit of
the same events' deltas.

Both take the same events -- N payment requests over K accounts -- staged as a processing
attempt would stage them: the requests as they are for the decision, the per-account sums for
the plain commit. The commit is what is compared; within a trial each side goes first in turn,
and the first trial warms the caches. The decided attempt records its requests and runs when it
completes, in the processing task: that time is reported beside the row (it runs in parallel
with other txids). A second row has a pipelined commit: two txids complete before the first
commits, the second resending 1% of the first's request ids, which its completion leaves out for
now and its commit confirms decided.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from airflow_transactional import DecisionSpec, EventLog, PostgresLogSource, StateSpec, TopologySpec
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import attempts
from bench.measure import Row


def requests(n: int, accounts: int, rng: random.Random) -> list[tuple[str, int]]:
    """(account, amount) of ``n`` requests: mostly debits, some credits."""
    return [(f"acct{rng.randrange(accounts)}", rng.choice([-40, -25, -10, 30])) for _ in range(n)]


Events = list[tuple[str, int]]


class _Trials:
    """The two topologies of the section and one trial of each way to commit (seconds each)."""

    def __init__(self, dsn: str, trials: int) -> None:
        log = EventLog(dsn, "bench_decide")
        log.create(1)
        log.append([(f"d{i}", "{}") for i in range(4 * (trials + 1))])
        log.close()
        self.coord = Coordinator(dsn)
        source = PostgresLogSource("bench_decide")
        self.coord.register(TopologySpec("bench_decided", source, [
            StateSpec("balances", {"account": "text"}, table="bench_decided_balances")],
            decisions=[DecisionSpec("pay", state="balances", floor=-500)], max_in_flight=1000, max_batch_size=1))
        self.coord.register(TopologySpec("bench_plain", source, [
            StateSpec("balances", {"account": "text"}, table="bench_plain_balances")],
            max_in_flight=1000, max_batch_size=1))
        self.recording: list[float] = []

    def complete(self, run_key: str, events: Events, rid: Callable[[int], str]) -> tuple[int, float]:
        """Plan, stage and complete one decided txid of ``events``, the one at ``seq`` with request
        id ``rid(seq)``; (its txid, the seconds its completion took)."""
        txn = self.coord.plan("bench_decided", run_key)
        attempt, txn = attempts.begin_attempt(self.coord.store, "bench_decided", txn.txid)
        staged = self.coord.stage_requests(attempt, "pay", (((acct,), seq, rid(seq), amount)
                                                            for seq, (acct, amount) in enumerate(events)))
        t0 = time.perf_counter()
        attempts.finish_attempt(self.coord.store, attempt, {"pay": staged}, records_read=len(events))
        return txn.txid, time.perf_counter() - t0

    def decided(self, trial: int, events: Events) -> float:
        txid, took = self.complete(f"t{trial}", events, lambda seq: f"r{trial}-{seq}")
        self.recording.append(took)
        t0 = time.perf_counter()
        self.coord.commit("bench_decided", txid)
        return time.perf_counter() - t0

    def plain(self, trial: int, events: Events) -> float:
        sums: dict[str, int] = {}
        for acct, amount in events:
            sums[acct] = sums.get(acct, 0) + amount
        txn = self.coord.plan("bench_plain", f"t{trial}")
        attempt, txn = attempts.begin_attempt(self.coord.store, "bench_plain", txn.txid)
        staged = self.coord.stage(attempt, "balances", sums.items())
        attempts.finish_attempt(self.coord.store, attempt, {"balances": staged}, records_read=len(events))
        t0 = time.perf_counter()
        self.coord.commit("bench_plain", txn.txid)
        return time.perf_counter() - t0

    def pipelined(self, trial: int, events: Events) -> float:
        """Commit time of the second of two txids that both completed before the first committed."""
        again = len(events) // 100
        first, _ = self.complete(f"p{trial}-0", events, lambda seq: f"p{trial}a-{seq}")
        second, _ = self.complete(f"p{trial}-1", events,
                                  lambda seq: f"p{trial}{'a' if seq < again else 'b'}-{seq}")
        self.coord.commit("bench_decided", first)
        t0 = time.perf_counter()
        self.coord.commit("bench_decided", second)
        return time.perf_counter() - t0


def run(dsn: str, sizes: Any, report: Any) -> None:
    n, k = sizes.decision_requests, sizes.decision_accounts
    rng = random.Random(11)
    run = _Trials(dsn, sizes.decision_trials)
    ways = {"decided": run.decided, "plain": run.plain, "pipelined": run.pipelined}
    times: dict[str, list[float]] = {way: [] for way in ways}
    try:
        for trial in range(sizes.decision_trials + 1):
            events = requests(n, k, rng)
            # Each goes first in turn: every decided commit leaves the balances lower, so the next
            # one declines more and decides more requests one by one.
            order = list(ways)[trial % 3:] + list(ways)[:trial % 3]
            for way in order:
                took = ways[way](trial, events)
                if trial:  # trial 0 warms the caches
                    times[way].append(took)
    finally:
        run.coord.close()
    o, b, p = (statistics.median(times[way]) for way in ("decided", "plain", "pipelined"))
    report.add(Row("decisions", f"commit deciding {n:,} requests over {k:,} keys in order vs a plain commit of "
                                "their per-key deltas", f"{o:.3f} s", f"{b:.3f} s", o / b, "<= 2.0x", o / b <= 2.0,
                   f"the attempt's completion records the requests first: {statistics.median(run.recording[1:]):.2f} s "
                   "in the processing task"))
    report.add(Row("decisions", "the same, pipelined: its attempt completed before its predecessor committed, "
                                "1% of the request ids sent again", f"{p:.3f} s", f"{b:.3f} s", p / b, "<= 2.0x",
                   p / b <= 2.0))
