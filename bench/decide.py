"""The cost of deciding in the commit: a commit whose batch of requests is decided per key in
source order (``DecisionSpec``) vs a plain commit of the same events' deltas (``bench.perf``,
section ``decisions``).

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


def requests(n: int, accounts: int, rng: random.Random) -> list[tuple[str, int]]:
    """(account, amount) of ``n`` requests: mostly debits, some credits."""
    return [(f"acct{rng.randrange(accounts)}", rng.choice([-40, -25, -10, 30])) for _ in range(n)]


def bench_decisions(dsn: str, sizes: Any, report: Any) -> None:
    from bench.perf import Row

    n, k = sizes.decision_requests, sizes.decision_accounts
    log = EventLog(dsn, "bench_decide")
    log.create(1)
    log.append([(f"d{i}", "{}") for i in range(4 * (sizes.decision_trials + 1))])
    log.close()
    coord = Coordinator(dsn)
    source = PostgresLogSource("bench_decide")
    coord.register(TopologySpec("bench_decided", source, [StateSpec("balances", {"account": "text"},
                                                                    table="bench_decided_balances")],
                                decisions=[DecisionSpec("pay", state="balances", floor=-500)],
                                max_in_flight=1000, max_batch_size=1))
    coord.register(TopologySpec("bench_plain", source, [StateSpec("balances", {"account": "text"},
                                                                  table="bench_plain_balances")],
                                max_in_flight=1000, max_batch_size=1))
    rng = random.Random(11)

    def complete(run_key: str, events: list[tuple[str, int]], rid: Callable[[int], str]) -> tuple[int, float]:
        """Plan, stage and complete one decided txid of ``events``, the one at ``seq`` with request
        id ``rid(seq)``; (its txid, the seconds its completion took)."""
        txn = coord.plan("bench_decided", run_key)
        attempt, txn = coord.begin_attempt("bench_decided", txn.txid)
        staged = coord.stage_requests(attempt, "pay", (((acct,), seq, rid(seq), amount)
                                                       for seq, (acct, amount) in enumerate(events)))
        t0 = time.perf_counter()
        coord.finish_attempt(attempt, {"pay": staged}, records_read=len(events))
        return txn.txid, time.perf_counter() - t0

    def decided(trial: int, events: list[tuple[str, int]]) -> float:
        txid, took = complete(f"t{trial}", events, lambda seq: f"r{trial}-{seq}")
        recording.append(took)
        t0 = time.perf_counter()
        coord.commit("bench_decided", txid)
        return time.perf_counter() - t0

    def plain(trial: int, events: list[tuple[str, int]]) -> float:
        sums: dict[str, int] = {}
        for acct, amount in events:
            sums[acct] = sums.get(acct, 0) + amount
        txn = coord.plan("bench_plain", f"t{trial}")
        attempt, txn = coord.begin_attempt("bench_plain", txn.txid)
        staged = coord.stage(attempt, "balances", sums.items())
        coord.finish_attempt(attempt, {"balances": staged}, records_read=len(events))
        t0 = time.perf_counter()
        coord.commit("bench_plain", txn.txid)
        return time.perf_counter() - t0

    def pipelined(trial: int, events: list[tuple[str, int]]) -> float:
        """Commit time of the second of two txids that both completed before the first committed."""
        again = len(events) // 100
        first, _ = complete(f"p{trial}-0", events, lambda seq: f"p{trial}a-{seq}")
        second, _ = complete(f"p{trial}-1", events, lambda seq: f"p{trial}{'a' if seq < again else 'b'}-{seq}")
        coord.commit("bench_decided", first)
        t0 = time.perf_counter()
        coord.commit("bench_decided", second)
        return time.perf_counter() - t0

    steps: list[Callable[[int, list[tuple[str, int]]], float]] = [decided, plain, pipelined]
    times: dict[Callable[[int, list[tuple[str, int]]], float], list[float]] = {step: [] for step in steps}
    recording: list[float] = []
    try:
        for trial in range(sizes.decision_trials + 1):
            events = requests(n, k, rng)
            # Each goes first in turn: every decided commit leaves the balances lower, so the next
            # one declines more and decides more requests one by one.
            for step in steps[trial % 3:] + steps[:trial % 3]:
                took = step(trial, events)
                if trial:  # trial 0 warms the caches
                    times[step].append(took)
    finally:
        coord.close()
    ours, base, behind = times[decided], times[plain], times[pipelined]
    o, b, p = statistics.median(ours), statistics.median(base), statistics.median(behind)
    report.add(Row("decisions", f"commit deciding {n:,} requests over {k:,} keys in order vs a plain commit of "
                                "their per-key deltas", f"{o:.3f} s", f"{b:.3f} s", o / b, "<= 2.0x", o / b <= 2.0,
                   f"the attempt's completion records the requests first: {statistics.median(recording[1:]):.2f} s "
                   "in the processing task"))
    report.add(Row("decisions", "the same, pipelined: its attempt completed before its predecessor committed, "
                                "1% of the request ids sent again", f"{p:.3f} s", f"{b:.3f} s", p / b, "<= 2.0x",
                   p / b <= 2.0))
