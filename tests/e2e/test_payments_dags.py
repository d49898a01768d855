"""The payments example on Airflow, both stages: stage 1's runs triggered over REST, stage 2's from
stage 1's ledger asset events, their batches on the stack's Spark Connect server, the producers'
deposits and requests against the invariants of ``dev/payments.py`` -- the chaos harness's payments
run without its faults (the mixes under faults are ``python -m bench.chaos``: docs/chaos.md)."""

from __future__ import annotations

import pytest

from airflow_transactional.airflow.lineage import RUN_FACET, store_namespace
from bench.chaos import Chaos
from dev.localstack import LocalStack
from tests.e2e.conftest import PAYMENTS_RUN, lineage_events

pytestmark = pytest.mark.e2e


def test_the_payments_example_keeps_every_invariant_across_both_stages(stack: LocalStack) -> None:
    report = Chaos(stack, PAYMENTS_RUN).run()
    print(report.table())
    assert report.violations == 0 and not report.problems, report.table()
    assert sum(report.faults.values()) == 0  # the harness's run, no fault of its own
    assert report.transactions_committed >= PAYMENTS_RUN.transactions
    assert report.commits_downstream["settlement"] > 1, report.table()
    decided = report.decided
    assert decided["granted"] > 0 and decided["declined"] > 0 and decided["quarantined"] > 0, report.table()
    assert decided["granted"] + decided["declined"] + decided["quarantined"] == report.events_appended
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
