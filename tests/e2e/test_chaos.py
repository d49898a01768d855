"""The chaos harness at CI size: faults of every cheap kind while ``words`` commits, then the
oracle; and the payments example's two stages under the same faults, then its invariants. (The
Kafka and S3 modes' mixes run in ``python -m bench.chaos --mode kafka`` and ``--mode s3`` alone:
each of their faults has a test of its own in the tiers, docs/chaos.md.)"""

from __future__ import annotations

import pytest

from airflow_transactional.airflow.lineage import RUN_FACET, store_namespace
from bench.chaos import KINDS, Chaos
from bench.chaos.config import CONNECT_KINDS, CORRECTION_KINDS
from dev.localstack import LocalStack
from tests.e2e.conftest import (
    CHAOS_CI,
    CHAOS_PAYMENTS_CI,
    exactly_once,
    lineage_events,
)

pytestmark = pytest.mark.e2e


def test_chaos_keeps_every_event_exactly_once_and_in_order(stack: LocalStack) -> None:
    report = Chaos(stack, CHAOS_CI).run()
    injected = exactly_once(report, CHAOS_CI)
    assert sum(report.faults[k] for k in injected) >= CHAOS_CI.faults and len(injected) >= 4, report.table()
    assert set(injected) <= set(KINDS + CORRECTION_KINDS + CONNECT_KINDS)
    assert report.malformed_injected > 0 and report.duplicate_deliveries > 0, report.table()
    # The operator's correction of a committed txid, under every other fault: committed once, in
    # order, changing nothing (the job is deterministic), and the state still the oracle's.
    assert report.corrections >= 1 and report.corrections_changed == 0, report.table()
    # And a malformed record fixed by hand and replayed: the oracle counted its URL once (above).
    assert report.replays >= 1, report.table()
    # Each run's verify task (the shadow audit) under the same faults: every committed txid -- the
    # correction and the replay too -- recomputed from its source and verified, none failed.
    assert report.verified_through == report.transactions_committed, report.table()
    assert report.verification == {"verified": report.transactions_committed}, report.table()


def test_chaos_payments_keep_every_invariant_across_both_stages(stack: LocalStack) -> None:
    # Stage 1 runs are triggered over REST; every stage 2 run but the first comes from stage 1's
    # ledger asset events. Faults (kills of either stage's Spark Connect client or commit, clears
    # of committed runs of either, the server lost under a batch) strike both; every invariant of
    # dev/payments.py must hold.
    report = Chaos(stack, CHAOS_PAYMENTS_CI).run()
    print(report.table())
    assert report.violations == 0, report.table()
    assert report.transactions_committed >= CHAOS_PAYMENTS_CI.transactions
    assert report.commits_downstream["settlement"] > 1, report.table()
    decided = report.decided
    assert decided["granted"] > 0 and decided["declined"] > 0 and decided["quarantined"] > 0, report.table()
    assert decided["granted"] + decided["declined"] + decided["quarantined"] == report.events_appended
    assert sum(report.faults.values()) >= CHAOS_PAYMENTS_CI.faults - 2, report.table()
    runs = stack.client().runs("settlement")
    assert any(r["run_type"] == "asset_triggered" for r in runs), [r["run_type"] for r in runs]
    # OpenLineage joins the stages: stage 1's commits write the ledger log stage 2's commits read.
    namespace, db = store_namespace(stack.state_dsn)
    ledger = (namespace, f"{db}.airflow_txn.log.ledger")
    written = [e for e in lineage_events(stack, "payments.commit") if e["run"]["facets"][RUN_FACET]["committed"]]
    read = [e for e in lineage_events(stack, "settlement.commit") if e["run"]["facets"][RUN_FACET]["committed"]]
    assert written and all(ledger in [(d["namespace"], d["name"]) for d in e["outputs"]] for e in written)
    assert read and all([(d["namespace"], d["name"]) for d in e["inputs"]] == [ledger] for e in read)
    settled = report.commits_downstream["settlement"]
    assert {e["run"]["facets"][RUN_FACET]["txid"] for e in read} <= set(range(1, settled + 1))

