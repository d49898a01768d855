"""The chaos harness at CI size: faults of every kind while ``words`` commits, then the oracle."""

from __future__ import annotations

import pytest

from bench.chaos import KINDS, Chaos
from dev.localstack import LocalStack
from tests.e2e.conftest import CHAOS_CI

pytestmark = pytest.mark.e2e


def test_chaos_keeps_every_event_exactly_once_and_in_order(stack: LocalStack) -> None:
    report = Chaos(stack, CHAOS_CI).run()
    print(report.table())
    assert report.violations == 0, report.table()
    assert report.events_lost == report.events_duplicated == report.order_violations == report.stuck_runs == 0
    assert report.transactions_committed >= CHAOS_CI.transactions
    injected = {k: n for k, n in report.faults.items() if n}
    assert sum(injected.values()) >= 10 and len(injected) >= 4, report.table()
    assert set(injected) <= set(KINDS)
    assert report.malformed_injected > 0 and report.duplicate_deliveries > 0, report.table()
