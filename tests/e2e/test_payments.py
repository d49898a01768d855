"""The payments pipeline on a real Airflow: ``payments`` runs triggered over REST decide the
requests in their commits and append the ledger; each commit's ledger asset event starts a
``settlement`` run (``AssetOrTimeSchedule``), which credits the payees in txid order. A committed
payments run cleared and re-run changes nothing, and every invariant of ``dev.payments`` holds
against the producers' own ledger."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from airflow_transactional.coordinator import Coordinator
from dev import payments
from dev.localstack import LocalStack, RestClient
from tests.e2e.conftest import wait_for_runs

pytestmark = pytest.mark.e2e


def _settled(coord: Coordinator, client: RestClient, timeout: float = 600) -> list[dict[str, object]]:
    """Wait until settlement has read the whole ledger and no run of it is active; its runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = client.runs("settlement")
        try:
            lag = coord.status("settlement").lag
        except Exception:  # not planned once yet
            lag = -1
        if lag == 0 and runs and all(r["state"] in ("success", "failed") for r in runs):
            return runs
        time.sleep(5)
    states = [r["state"] for r in client.runs("settlement")]
    raise AssertionError(f"settlement did not catch up in {timeout:.0f}s: {states}")


def test_payments_decide_in_the_commit_and_settlement_follows_each_commit(stack: LocalStack,
                                                                           client: RestClient) -> None:
    dsn = stack.state_dsn
    requests, ledger = payments.create_logs(dsn)
    deposits = {a: 300 for a in payments.ACCOUNTS}
    payments.deposit(ledger, deposits)
    sent = payments.requests(60, seed=21, invalid_every=13)
    payments.send(requests, sent)
    for dag_id in ("settlement", "payments"):  # settlement first: it creates the payments headroom
        client.wait_for_dag(dag_id)
        client.unpause(dag_id)
    coord = Coordinator(dsn)
    start = datetime.now(UTC) - timedelta(hours=1)
    wait_for_runs(stack, "settlement", [client.trigger("settlement", start.isoformat())["dag_run_id"]])
    _settled(coord, client)  # registered, and the deposits credited

    first = client.trigger("payments", start.isoformat())["dag_run_id"]
    wait_for_runs(stack, "payments", [first])
    more = payments.requests(60, seed=22, start=500, invalid_every=13)
    payments.send(requests, more)
    second = client.trigger("payments", (start + timedelta(minutes=1)).isoformat())["dag_run_id"]
    wait_for_runs(stack, "payments", [second])
    runs = _settled(coord, client)
    assert any(r["run_type"] == "asset_triggered" for r in runs), [r["run_type"] for r in runs]

    # A committed run cleared and run again decides nothing twice and appends nothing.
    before = coord.commits("payments")
    client.clear("payments", first)
    wait_for_runs(stack, "payments", [first])
    assert coord.commits("payments") == before

    numbers = payments.check(dsn, sent + more, deposits)
    assert numbers["granted"] > 20 and numbers["declined"] > 0 and numbers["quarantined"] == 10
    commits = coord.commits("settlement")
    assert [c["txid"] for c in commits] == list(range(1, len(commits) + 1))
