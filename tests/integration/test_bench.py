"""The benchmark's Postgres sections at toy sizes, so the benchmark cannot rot unnoticed: the
commit trials really commit (checked in the audit log and the state table), planning really
plans, and the report prints a row per measure."""

from __future__ import annotations

import pytest

from bench.measure import Report, Sizes
from bench.sections import commit, decisions, plan
from tests.helpers import query

pytestmark = pytest.mark.integration


def test_commit_and_plan_sections_measure_real_commits_and_plans(dsn: str) -> None:
    sizes = Sizes(commit_delta=400, commit_small_state=300, commit_large_state=3000, commit_trials=2,
                  plan_small_log=40_000, plan_large_log=80_000, plan_trials=3)
    report = Report(started="2026-11-22T00:00:00+00:00", machine="test", quick=True)
    commit.run(dsn, sizes, report)
    plan.run(dsn, sizes, report)

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


def test_the_decisions_section_decides_every_request_and_commits_the_same_events_plainly(dsn: str) -> None:
    sizes = Sizes(decision_requests=500, decision_accounts=20, decision_trials=2)
    report = Report(started="2026-11-22T00:00:00+00:00", machine="test", quick=True)
    decisions.run(dsn, sizes, report)

    row, piped = report.rows
    for r in (row, piped):
        assert r.section == "decisions" and r.ratio is not None and r.ratio > 0 and r.target == "<= 2.0x"
    assert piped.measure.startswith("the same, pipelined") and piped.baseline == row.baseline
    # Warm-up + 2 trials, each with a decided txid, a plain one and a pipelined pair whose second
    # txid sends 1% (5) of the first's request ids again: every request got one verdict, the ones
    # sent again in the first txid of their pair.
    assert query(dsn, "SELECT count(*), count(DISTINCT request_id), count(DISTINCT txid) "
                      "FROM airflow_txn.verdicts") == [(3 * 500 + 3 * 995,) * 2 + (9,)]
    firsts = query(dsn, "SELECT DISTINCT txid FROM airflow_txn.verdicts WHERE request_id LIKE 'p_a-%'")
    assert len(firsts) == 3 and query(dsn, "SELECT count(*) FROM airflow_txn.verdicts WHERE txid = ANY(%s) "
                                           "AND request_id LIKE 'p_b-%%'", ([t for (t,) in firsts],)) == [(0,)]
    assert query(dsn, "SELECT topology_id, max(txid) FROM airflow_txn.commits GROUP BY 1 ORDER BY 1") == [
        ("bench_decided", 9), ("bench_plain", 3)]
    assert "in the processing task" in row.note
    # The plain side applied every event; the decided side only the grants, never under the floor.
    granted = query(dsn, "SELECT sum(amount) FROM airflow_txn.verdicts WHERE granted")[0][0]
    assert query(dsn, "SELECT sum(value) FROM bench_decided_balances")[0][0] == granted
    assert query(dsn, "SELECT min(balance_after) >= -500 FROM airflow_txn.verdicts WHERE granted") == [(True,)]
    assert query(dsn, "SELECT count(*) FROM airflow_txn.verdicts WHERE NOT granted")[0][0] > 0
