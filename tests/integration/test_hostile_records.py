"""No record can stop a topology (the pure-Python processor): whatever a producer appends, the
batch commits, every record is counted or quarantined with its reason, and the states hold what
the oracle computes from the good records alone (tests/hostile.py)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, example, given, settings

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from dev.embedded import EmbeddedPostgres
from tests.helpers import query
from tests.hostile import BATCHES, EXAMPLES, counting_fn, oracle

pytestmark = pytest.mark.integration


def _topology(name: str) -> TopologySpec:
    return TopologySpec(name, PostgresLogSource(name), [
        StateSpec("hostile_count", {"user_id": "text"}, combiner="count", table=f"{name}_count"),
        StateSpec("hostile_amount", {"user_id": "text"}, combiner="sum", table=f"{name}_amount")],
        max_batch_size=1000)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=BATCHES)
@example(batch=EXAMPLES[0])
@example(batch=EXAMPLES[1])
@example(batch=EXAMPLES[2])
@example(batch=EXAMPLES[3])

def test_any_batch_commits_with_its_bad_records_quarantined(pg: EmbeddedPostgres, batch: list[str]) -> None:
    dsn = pg.create_database(f"h_{uuid.uuid4().hex[:10]}")
    name = "hostile"
    log = EventLog(dsn, name)
    coord = Coordinator(dsn)
    try:
        log.create(1)  # one partition: the log's order is the order appended, the oracle's
        appended = log.append([(f"e{n}", text) for n, text in enumerate(batch)])
        assert appended.appended == len(batch) and not appended.rejected
        coord.register(_topology(name))
        txn = coord.plan(name, "r1")
        result = process_batch(coord, name, txn.txid, counting_fn)
        assert coord.commit(name, txn.txid).committed
        counts, sums, bad = oracle(batch)
        assert dict(query(dsn, f"SELECT user_id, value FROM {name}_count")) == counts
        assert dict(query(dsn, f"SELECT user_id, value FROM {name}_amount")) == sums
        quarantined = query(dsn, "SELECT event_id, reason FROM airflow_txn.quarantine WHERE committed ORDER BY id")
        assert [int(e[1:]) for e, _ in quarantined] == bad
        assert all(reason for _, reason in quarantined)
        assert result.quarantined == len(bad) and result.records_read == len(batch)
    finally:
        coord.close()
        log.close()
        pg.drop_database(dsn.split("dbname=")[1].split()[0])


def test_a_fifty_megabyte_key_is_quarantined_as_a_prefix_and_the_batch_commits(dsn: str) -> None:
    """The issue's own cases, each a batch that used to fail every attempt: a 50 MB key (past the
    index row limit many times over), a NUL inside a key, text for a sum, nesting past what the
    parser's recursion survives."""
    import json

    log = EventLog(dsn, "hostile")
    coord = Coordinator(dsn)
    log.create(1)
    batch = [json.dumps({"user": "ann", "amount": 5}), json.dumps({"user": "x" * 50_000_000, "amount": 1}),
             json.dumps({"user": "k\u0000ey", "amount": 1}), json.dumps({"user": "bob", "amount": "lots"}),
             '{"user": "cy", "amount": 1, "x": ' + "[" * 200_000 + "]" * 200_000 + "}",
             json.dumps({"user": "ann", "amount": 2})]
    log.append([(f"e{n}", text) for n, text in enumerate(batch)])
    coord.register(_topology("hostile"))
    txn = coord.plan("hostile", "r1")
    process_batch(coord, "hostile", txn.txid, counting_fn)
    assert coord.commit("hostile", txn.txid).committed
    assert dict(query(dsn, "SELECT user_id, value FROM hostile_amount")) == {"ann": 7}
    rows = query(dsn, "SELECT event_id, reason, length(record), record_length FROM airflow_txn.quarantine ORDER BY id")
    assert [r[0] for r in rows] == ["e1", "e2", "e3", "e4"]
    assert "50,000,000 bytes long, more than the 1,024 allowed" in rows[0][1]
    assert rows[0][2] == 4096 and rows[0][3] == len(batch[1])
    assert "NUL" in rows[1][1] and "must be a number (bigint), got 'lots'" in rows[2][1]
    assert "nests deeper than 512 levels" in rows[3][1]
    coord.close()
    log.close()


@pytest.mark.parametrize("kind", ["transactional", "opaque"])
def test_a_sum_that_leaves_its_type_only_once_committed_sets_that_key_aside_not_the_topology(
        dsn: str, kind: str) -> None:
    """A record near a bigint's limit commits; a later small one for the same key would carry the
    committed sum out of range: the commit used to fail on every try. That key's delta is set aside
    (quarantined with the reason), the rest of the txid commits, and later txids go on."""
    import json

    from tests.helpers import run_one

    spec = _topology("near")
    spec = TopologySpec(spec.topology_id, spec.source, [StateSpec(s.name, s.keys, combiner=s.combiner, kind=kind,
                                                                   table=s.table) for s in spec.states],
                        max_batch_size=2)
    log = EventLog(dsn, "near")
    log.create(1)
    coord = Coordinator(dsn)
    coord.register(spec)
    rows = [("ann", 2**63 - 10), ("bob", 1), ("ann", 20), ("bob", 2), ("ann", -5), ("bob", 3)]
    log.append([(f"e{n}", json.dumps({"user": user, "amount": amount})) for n, (user, amount) in enumerate(rows)])
    for run in ("r1", "r2", "r3"):
        run_one(coord, "near", run, counting_fn)
    assert coord.status("near").committed_txid == 3
    assert dict(query(dsn, "SELECT user_id, value FROM near_amount")) == {"ann": 2**63 - 15, "bob": 6}
    [(offset, reason, record)] = query(dsn, "SELECT source_offset, reason, record FROM airflow_txn.quarantine")
    assert offset == "commit:hostile_amount" and "leaves bigint" in reason and "value_type='numeric'" in reason
    assert json.loads(record) == {"key": ["ann"], "committed": str(2**63 - 10), "delta": "20"}
    assert [c["quarantined"] for c in coord.commits("near")] == [0, 1, 0]
    coord.close()
    log.close()
