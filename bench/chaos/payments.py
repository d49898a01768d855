"""The payments mode: the payments example's two stages (``dags/payments.py``) under the faults.

The bank deposits first; then producers append payment requests to ``payment_requests``, each to
its payer's partition -- some invalid (a zero or negative amount, a payment to oneself), some not
even JSON, some delivered twice. The harness triggers ``payments`` runs; each of their commits
decides requests and appends the ledger, whose asset event starts a ``settlement`` run. The
faults strike either stage. The checks are ``dev.payments.check``'s invariants (every request
decided exactly once, none below its limit at any commit, each grant once outgoing and once
incoming, money conserved, statements equal to balances) against the producers' own ledger.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

from airflow_transactional.sources.eventlog import partition_of
from dev import payments
from dev.localstack import LocalStack, RestClient

from .config import ChaosReport
from .supervisor import rest
from .workload import Ledger, Producer

INVALID_RATE = 0.03  # chance a request is one the validation refuses (quarantined, never decided)
DEPOSIT = 2000       # each account's opening deposit: enough that most requests are granted at first


class PaymentsProducer(Producer):
    """Appends payment requests until stopped, each to its payer's partition."""

    LOG = "payment_requests"
    ID_PREFIX = "pay-p"
    MALFORMED = ('{"id": "x", "amount": 12', '{"to": "acct01", "amount": 5}', "not json at all")

    def _record(self, eid: str) -> tuple[str, str, Any]:
        req = payments.request(self.rng, eid, invalid=self.rng.random() < INVALID_RATE)
        return eid, json.dumps(req), req

    def _append(self, batch: list[tuple[str, str]]) -> None:
        by_partition: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for eid, payload in batch:
            try:
                key = str(json.loads(payload)["from"])
            except (ValueError, KeyError, TypeError):  # not a request: where its id puts it
                key = eid
            by_partition[partition_of(key, payments.REQUEST_PARTITIONS)].append((eid, payload))
        for partition, events in sorted(by_partition.items()):  # a retry re-sends all: the log drops the dups
            self.log.append(events, partition=partition)


def setup(stack: LocalStack, client: RestClient, ledger: Ledger) -> None:
    """The logs, the bank's deposits (kept in the ledger), and settlement's first run -- it
    creates ``credits``, payments' headroom -- before payments is unpaused."""
    _, ledger_log = payments.create_logs(stack.state_dsn)
    deposits = {a: DEPOSIT for a in payments.ACCOUNTS}
    payments.deposit(ledger_log, deposits)
    ledger_log.close()
    ledger.record_deposits(deposits)
    rest(client.wait_for_dag, "settlement")
    rest(client.unpause, "settlement")
    run_id = rest(client.trigger, "settlement", None, "chaos-settlement-setup")["dag_run_id"]
    deadline = time.monotonic() + 600
    while (state := rest(client.run, "settlement", run_id)["state"]) not in ("success", "failed"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"settlement's first run is still {state} after ten minutes")
        time.sleep(2)
    if state != "success":
        raise RuntimeError(f"settlement's first run {run_id} failed before any fault: see its task logs")
    rest(client.wait_for_dag, "payments")
    rest(client.unpause, "payments")


def check(dsn: str, report: ChaosReport, ledger: Ledger) -> None:
    """The invariants of ``dev.payments.check`` on what the ledger says was sent and deposited;
    a post-mortem checks only what holds before the stages have drained."""
    sent = list(ledger.valid.values()) + [{"id": e} for e in sorted(ledger.malformed)]
    report.events_appended = len(sent)
    report.malformed_injected = sum(1 for r in sent if not payments.valid(r))
    report.duplicate_deliveries = ledger.duplicates
    try:
        report.decided = payments.check(dsn, sent, ledger.deposits, drained=not report.post_mortem)
    except AssertionError as exc:
        report.invariant_failures.append(f"payments invariant: {exc}")
        return
    if report.post_mortem:  # appended, neither decided nor quarantined yet
        d = report.decided
        report.events_pending = report.events_appended - d["granted"] - d["declined"] - d["quarantined"]
