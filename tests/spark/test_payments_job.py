"""The payments example under Spark: ``spark_jobs/payments.py`` validates requests and stages
them for the ``pay`` decision, the commit decides them in log order per payer and appends the
ledger events, ``spark_jobs/settlement.py`` settles them -- stages interleaved, invalid
requests quarantined, a txid processed twice, a request sent again -- and every invariant of
``dev.payments`` holds: the output events of a Spark job are appended once, by the commit, to
the partition the log itself would choose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.sources.eventlog import partition_of
from airflow_transactional.spec import TopologySpec
from dev import payments
from tests.helpers import query, spark_submit

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


def example_specs() -> dict[str, TopologySpec]:
    """The two topologies exactly as ``dags/payments.py`` declares them."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / "payments.py"))
    assert bag.import_errors == {}
    return {d: TopologySpec.from_config(bag.dags[d].get_task("plan").topology) for d in ("payments", "settlement")}


def job(dsn: str, name: str, topology: str, txid: int) -> None:
    res = spark_submit(dsn, str(REPO / "spark_jobs" / f"{name}.py"), "--topology", topology, "--txid", str(txid))
    assert res.returncode == 0, res.stderr[-3000:]


def drain(coord: Coordinator, dsn: str, topology: str, tag: str, *, first_twice: bool = False) -> int:
    for n in range(50):
        txn = coord.plan(topology, f"{tag}{n}")
        if txn.empty:
            coord.commit(topology, txn.txid)
            return n
        for _ in range(2 if first_twice and n == 0 else 1):  # two attempts: the commit takes one
            job(dsn, topology, topology, txn.txid)
        coord.commit(topology, txn.txid)
    raise AssertionError(f"{topology} never drained")


def test_the_payments_example_keeps_every_invariant_under_spark(dsn: str) -> None:
    specs = example_specs()
    requests, ledger = payments.create_logs(dsn)
    coord = Coordinator(dsn)
    coord.register(specs["settlement"])  # keeps the credits, the payments decision's headroom
    coord.register(specs["payments"])
    deposits = {a: 200 + 100 * (i % 5) for i, a in enumerate(payments.ACCOUNTS)}
    payments.deposit(ledger, deposits)
    sent = payments.requests(160, seed=7, invalid_every=23)
    payments.send(requests, sent)
    requests.append([("garbled", "{not json")], partition=0)
    # A client sending a request again (another event id, another amount): the first is decided.
    first = next(r for r in sent if payments.valid(r))
    requests.append([(f"again-{first['id']}", json.dumps({**first, "amount": first["amount"] + 7}))],
                    partition=partition_of(first["from"], payments.REQUEST_PARTITIONS))
    assert drain(coord, dsn, "payments", "a", first_twice=True) >= 1
    # Nothing was settled yet, deposits included: what was granted came out of the overdrafts.
    assert query(dsn, "SELECT min(value) >= %s, count(*) > 0 FROM debits", (-payments.OVERDRAFT,)) == [(True, True)]
    drain(coord, dsn, "settlement", "s")
    more = payments.requests(160, seed=8, start=1000, invalid_every=23)
    payments.send(requests, more)
    drain(coord, dsn, "payments", "b")
    drain(coord, dsn, "settlement", "t")
    numbers = payments.check(dsn, sent + more, deposits)
    assert numbers["granted"] > 50 and numbers["declined"] > 160
    assert numbers["quarantined"] == 14 + 1  # every 23rd request, and the garbled one
    assert query(dsn, "SELECT reason FROM airflow_txn.quarantine WHERE event_id = 'garbled'")
    cost = first["amount"] + (payments.FEE if first["amount"] > payments.FEE_OVER else 0)
    assert query(dsn, "SELECT amount FROM airflow_txn.verdicts WHERE request_id = %s", (first["id"],)) == [(-cost,)]
    # Each output event went to the partition the log itself gives its key (Spark's crc32 = the log's).
    ledger = query(dsn, "SELECT partition, payload FROM airflow_txn.log_events WHERE log_name = 'ledger'")
    assert len(ledger) > 2 * numbers["granted"]
    assert all(p == partition_of(json.loads(x)["account"], payments.LEDGER_PARTITIONS) for p, x in ledger)
