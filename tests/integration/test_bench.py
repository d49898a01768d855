"""The benchmark's Postgres sections at toy sizes, so the benchmark cannot rot unnoticed: the
commit trials really commit (checked in the audit log and the state table), planning really
plans, and the report prints a row per measure."""

from __future__ import annotations

import pytest

from bench.perf import Report, Sizes, bench_commit, bench_plan
from tests.helpers import query

pytestmark = pytest.mark.integration


def test_commit_and_plan_sections_measure_real_commits_and_plans(dsn: str) -> None:
    sizes = Sizes(commit_delta=400, commit_small_state=300, commit_large_state=3000, commit_trials=2,
                  plan_small_log=40_000, plan_large_log=80_000, plan_trials=3)
    report = Report(started="2026-11-22T00:00:00+00:00", machine="test", quick=True)
    bench_commit(dsn, sizes, report)
    bench_plan(dsn, sizes, report)

    assert [r.section for r in report.rows] == ["commit", "commit", "commit", "plan"]
    assert all(r.ratio is not None and r.ratio > 0 for r in report.rows)
    # Warm-up + 2 trials committed per state size, in order; each staged 400 deltas.
    for topo in ("bench_commit_small", "bench_commit_large"):
        commits = query(dsn, "SELECT txid, row_counts->>'counts' FROM airflow_txn.commits "
                             "WHERE topology_id = %s ORDER BY txid", (topo,))
        assert commits == [(1, "400"), (2, "400"), (3, "400")]
    # The large state: 3000 prefilled keys, 200 new keys per commit and 200 per baseline upsert.
    assert query(dsn, "SELECT count(*) FROM bench_commit_large")[0][0] == 3000 + 3 * 200 + 3 * 200
    # Every delta row counts 1: the sum grows by exactly what both sides upserted.
    assert query(dsn, "SELECT sum(value) FROM bench_commit_large")[0][0] == 3000 + 3 * 400 + 3 * 400
    planned = query(dsn, "SELECT count(*), min(planned_records), max(planned_records) FROM airflow_txn.transactions "
                         "WHERE topology_id LIKE 'bench_plan_%'")
    assert planned == [(6, 10_000, 10_000)]
    table = report.table()
    assert "commit time, state 3,000 vs 300 rows" in table and "| met" in table
