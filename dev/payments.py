"""The payments example's producers and its invariant checker (``dags/payments.py``): what the
demo, the tests and the chaos harness run against it.

The invariants, from the producers' own ledger (what they appended) and the committed state:

* every valid request is decided exactly once, and every invalid one quarantined;
* no account is ever below its limit at any commit: each grant left the balance at or above it;
* every granted payment is in the ledger exactly once as outgoing and once as incoming (and once
  as a fee when one is due); every declined one exactly once as declined, and nothing else;
* money is conserved: once both stages have drained, credits plus debits add up to the
  deposits, account by account the statements add up to the balance, and none is below its limit.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from typing import Any

import psycopg2

from airflow_transactional.sources import EventLog
from airflow_transactional.sources.eventlog import partition_of

FEE_OVER, FEE = 1_000, 5  # as in spark_jobs/payments.py
OVERDRAFT = 100  # as in dags/payments.py
ACCOUNTS = [f"acct{i:02d}" for i in range(12)]
REQUEST_PARTITIONS, LEDGER_PARTITIONS = 4, 4
MOST_PER_PAYMENT = 1_000_000_000  # stage 1 quarantines a larger one (spark_jobs/payments.py)


def create_logs(dsn: str) -> tuple[EventLog, EventLog]:
    """The request log (by payer) and the ledger (the bank's deposits go there too)."""
    requests, ledger = EventLog(dsn, "payment_requests"), EventLog(dsn, "ledger")
    requests.create(REQUEST_PARTITIONS)
    ledger.create(LEDGER_PARTITIONS)
    return requests, ledger


def deposit(ledger: EventLog, amounts: dict[str, int]) -> None:
    for account, amount in amounts.items():
        event = {"type": "deposit", "request": f"deposit-{account}", "account": account, "amount": amount}
        ledger.append([(f"bank:deposit-{account}", json.dumps(event))],
                      partition=partition_of(account, LEDGER_PARTITIONS))


def request(rng: random.Random, request_id: str, *, invalid: bool = False) -> dict[str, Any]:
    """One payment request between two of the accounts; ``invalid``: one a validation refuses."""
    src, dst = rng.sample(ACCOUNTS, 2)
    req = {"id": request_id, "from": src, "to": dst, "amount": rng.choice([10, 40, 90, 250, 600, 1200])}
    if invalid:
        req.update(rng.choice([{"amount": 0}, {"to": src}, {"amount": -5}]))
    return req


def requests(n: int, seed: int, start: int = 0, invalid_every: int = 0) -> list[dict[str, Any]]:
    """``n`` payment requests between the accounts; every ``invalid_every``-th one is invalid."""
    rng = random.Random(seed)
    return [request(rng, f"pay-{i}", invalid=bool(invalid_every) and i % invalid_every == 0)
            for i in range(start, start + n)]


def send(log: EventLog, reqs: list[dict[str, Any]]) -> None:
    """Producers append each request to its payer's partition (its event id is the request id)."""
    by_partition: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for r in reqs:
        by_partition[partition_of(str(r["from"]), REQUEST_PARTITIONS)].append((r["id"], json.dumps(r)))
    for p, events in sorted(by_partition.items()):
        log.append(events, partition=p)


def valid(r: dict[str, Any]) -> bool:
    """Whether stage 1's validation lets ``r`` through (a record that is not even a request --
    ``{"id": ...}`` alone stands for unparsable bytes -- is invalid too)."""
    amount = r.get("amount")
    return (isinstance(amount, int) and not isinstance(amount, bool) and 0 < amount <= MOST_PER_PAYMENT
            and isinstance(r.get("from"), str) and isinstance(r.get("to"), str) and r["from"] != r["to"])


def _rows(dsn: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall()
    finally:
        conn.close()


def check(dsn: str, sent: list[dict[str, Any]], deposits: dict[str, int], *, drained: bool = True) -> dict[str, Any]:
    """Assert the invariants (the module docstring) of what ``sent`` and ``deposits`` became;
    the numbers. ``drained=False`` checks only what holds while the stages still run."""
    verdicts = dict(_rows(dsn, "SELECT request_id, granted FROM airflow_txn.verdicts "
                               "WHERE topology_id = 'payments' AND decision = 'pay'"))
    ok = [r for r in sent if valid(r)]
    quarantined = {e for (e,) in _rows(dsn, "SELECT event_id FROM airflow_txn.quarantine "
                                            "WHERE topology_id = 'payments' AND committed")}
    assert set(verdicts) <= {r["id"] for r in ok}, "a request was decided that nobody sent"
    if drained:
        assert set(verdicts) == {r["id"] for r in ok}, "a valid request was never decided"
        assert {r["id"] for r in sent if not valid(r)} <= quarantined, "an invalid request was not quarantined"
    assert not quarantined & set(verdicts), "a quarantined request was decided"
    below = _rows(dsn, "SELECT request_id, balance_after FROM airflow_txn.verdicts WHERE granted "
                       "AND balance_after < %s", (-OVERDRAFT,))
    assert not below, f"grants left balances below the limit: {below[:5]}"
    ledger = Counter((e["type"], e["request"]) for (p,) in _rows(
        dsn, "SELECT payload FROM airflow_txn.log_events WHERE log_name = 'ledger'") for e in [json.loads(p)])
    assert all(n == 1 for n in ledger.values()), f"ledger events twice: {[k for k, n in ledger.items() if n > 1][:5]}"
    amounts = {r["id"]: r["amount"] for r in ok}
    for request, granted in verdicts.items():
        expected = ({"outgoing", "incoming"} | ({"fee"} if amounts[request] > FEE_OVER else set())
                    if granted else {"declined"})
        got = {t for t in ("outgoing", "incoming", "fee", "declined") if (t, request) in ledger}
        assert got == expected, f"request {request} ({'granted' if granted else 'declined'}): ledger has {got}"
    stray = {r for t, r in ledger if t != "deposit" and r not in verdicts}
    assert not stray, f"ledger events of undecided requests: {sorted(stray)[:5]}"
    out = {"requests": len(sent), "granted": sum(verdicts.values()), "declined": len(verdicts) - sum(verdicts.values()),
           "quarantined": len(quarantined)}
    if drained:
        credits = dict(_rows(dsn, "SELECT account, value FROM credits"))
        debits = dict(_rows(dsn, "SELECT account, value FROM debits"))
        statements = dict(_rows(dsn, "SELECT account, sum(value) FROM statements GROUP BY account"))
        assert sum(credits.values()) + sum(debits.values()) == sum(deposits.values()), "money was made or lost"
        for account in set(credits) | set(debits):
            balance = credits.get(account, 0) + debits.get(account, 0)
            assert balance >= -OVERDRAFT, f"{account} is below its limit: {balance}"
            assert statements.get(account, 0) == balance, f"{account}'s statement does not add up to its balance"
        out["money"] = sum(deposits.values())
    return out
