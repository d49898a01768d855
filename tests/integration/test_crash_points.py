"""KIP-844's crash-point analysis, for real: the commit is killed at each of its steps (process
exit, or the server dropping the connection); afterwards the state is exactly before or exactly
after the commit, never between, and a rerun commits exactly once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import process_batch
from dev import faults
from tests.helpers import click, click_fn, counting_topology, make_log, query

pytestmark = pytest.mark.integration

POINTS = ["commit.begin", "commit.after_lock", "commit.after_verify", "commit.after_apply",
          "commit.after_checkpoint", "commit.before_commit", "commit.after_commit"]


def _snapshot(dsn: str) -> dict[str, object]:
    return {
        "count": query(dsn, "SELECT * FROM clicks_count ORDER BY 1"),
        "amount": query(dsn, "SELECT * FROM clicks_amount ORDER BY 1"),
        "checkpoint": query(dsn, "SELECT committed_txid, committed_offsets FROM airflow_txn.topologies"),
        "audit": query(dsn, "SELECT txid, attempt FROM airflow_txn.commits ORDER BY txid"),
        "txn": query(dsn, "SELECT txid, status FROM airflow_txn.transactions ORDER BY txid"),
    }


def _commit_in_child(dsn: str, txid: int, fault: str) -> subprocess.CompletedProcess[str]:
    code = ("import sys; from airflow_transactional.coordinator import Coordinator;"
            f"Coordinator({dsn!r}).commit('clicks', {txid})")
    return subprocess.run([sys.executable, "-c", code], env=faults.child_env(faults=fault),
                          capture_output=True, text=True, timeout=60)


# After the commit returns there is no open database transaction left to drop: exit only.
CASES = [(p, a) for p in POINTS for a in ("exit", "terminate") if (p, a) != ("commit.after_commit", "terminate")]


@pytest.mark.parametrize(("point", "action"), CASES)
def test_commit_killed_at_each_step_is_all_or_nothing(dsn: str, point: str, action: str) -> None:
    coord = Coordinator(dsn)
    log = make_log(dsn)
    coord.register(counting_topology(max_batch_size=20))
    log.append([click(i) for i in range(40)])
    t1 = coord.plan("clicks", "a")
    process_batch(coord, "clicks", t1.txid, click_fn)
    coord.commit("clicks", t1.txid)
    t2 = coord.plan("clicks", "b")
    process_batch(coord, "clicks", t2.txid, click_fn)
    before = _snapshot(dsn)

    child = _commit_in_child(dsn, t2.txid, f"{point}={action}")
    assert child.returncode != 0, child.stdout + child.stderr  # it really died
    crashed = _snapshot(dsn)
    committed = crashed["checkpoint"][0][0] == 2  # type: ignore[index]
    if point == "commit.after_commit":
        assert committed
    else:
        assert crashed == before  # nothing of the commit is visible
    coord.recover("clicks")
    result = coord.commit("clicks", t2.txid)
    assert result.committed is (not committed)
    after = _snapshot(dsn)
    assert after["audit"] == [(1, 1), (2, 1)]
    assert after["checkpoint"][0][0] == 2  # type: ignore[index]
    total = sum(v for _k, v, _t in after["count"])  # type: ignore[misc]
    assert total == 40  # every event counted once
    # Staged rows left: only the committed attempts' (the delta history), which add up to the state.
    assert query(dsn, "SELECT count(*) FROM airflow_txn.stg_1_clicks_count s WHERE NOT EXISTS (SELECT 1 FROM "
                      "airflow_txn.commits c WHERE c.txid = s.txid AND c.attempt = s.attempt)") == [(0,)]
    assert dict(coord.state_as_of("clicks", "clicks_count", 2)) == {k: v for k, v, _t in after["count"]}
    coord.close()
    log.close()


def test_racing_committers_never_both_commit_and_commits_stay_in_order(dsn: str) -> None:
    coord = Coordinator(dsn)
    log = make_log(dsn)
    coord.register(counting_topology(max_in_flight=8, max_batch_size=20))
    log.append([click(i) for i in range(160)])
    txids = [coord.plan("clicks", f"r{k}").txid for k in range(8)]
    for t in txids:
        process_batch(coord, "clicks", t, click_fn)
    # Four processes each try to commit every txid, in different orders, as fast as they can.
    code = """
import random, sys, time, json
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import WaitingForPredecessor
c = Coordinator(sys.argv[1]); order = list(range(1, 9)); random.Random(int(sys.argv[2])).shuffle(order)
won = []
pending = set(order)
while pending:
    for t in order:
        if t not in pending: continue
        try:
            if c.commit('clicks', t).committed: won.append(t)
            pending.discard(t)
        except WaitingForPredecessor:
            pass
print(json.dumps(won))
"""
    procs = [subprocess.Popen([sys.executable, "-c", code, dsn, str(seed)], stdout=subprocess.PIPE, text=True)
             for seed in range(4)]
    import json

    wins = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert sorted(t for w in wins for t in w) == txids  # each txid committed by exactly one
    audit = query(dsn, "SELECT txid, committed_at FROM airflow_txn.commits ORDER BY committed_at")
    assert [t for t, _ in audit] == txids  # recorded strictly in txid order
    assert sum(v for (v,) in query(dsn, "SELECT value FROM clicks_count")) == 160
    coord.close()
    log.close()
