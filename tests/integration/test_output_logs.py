"""Output logs: a topology's commit appends the events its transform emitted, in the commit's
one transaction, in txid order, never twice -- and a second topology reads that log as its
source, exactly once end to end across the two stages."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from airflow_transactional import OutputEvent, OutputSpec
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError, DeclarationChanged
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from dev import faults
from tests.helpers import click, make_log, query

pytestmark = pytest.mark.integration

BIG = 5  # clicks of at least this amount are passed on to the next stage


def stage1(**kw: Any) -> TopologySpec:
    """Counts clicks per user and passes the big ones on, keyed by user, to log ``big``."""
    return TopologySpec("stage1", PostgresLogSource("clicks"), [StateSpec("s1_count", {"user_id": "text"})],
                        outputs=[OutputSpec("big", partitions=2)], max_batch_size=kw.pop("max_batch_size", 15), **kw)


def stage1_fn(rec: dict[str, Any]) -> list[Any]:
    out: list[Any] = [("s1_count", (rec["user"],), 1)]
    if int(rec["amount"]) >= BIG:
        out.append(OutputEvent("big", {"user": rec["user"], "amount": int(rec["amount"]), "i": rec.get("i")},
                               key=rec["user"]))
    return out


def stage2() -> TopologySpec:
    return TopologySpec("stage2", PostgresLogSource("big"), [StateSpec("s2_amount", {"user_id": "text"})],
                        max_batch_size=4)


def stage2_fn(rec: dict[str, Any]) -> list[Any]:
    return [("s2_amount", (rec["user"],), rec["amount"])]


def clicks(lo: int, hi: int) -> list[tuple[str, str]]:
    return [(eid, json.dumps({**json.loads(p), "i": i})) for i in range(lo, hi) for eid, p in [click(i)]]


def drain(coord: Coordinator, topology_id: str, fn: Any, runs: str) -> list[int]:
    txids = []
    for n in range(100):
        txn = coord.plan(topology_id, f"{runs}{n}")
        if txn.empty:
            coord.commit(topology_id, txn.txid)
            return txids
        process_batch(coord, topology_id, txn.txid, fn)
        coord.commit(topology_id, txn.txid)
        txids.append(txn.txid)
    raise AssertionError("the source never ran dry")


def big_events(dsn: str) -> list[tuple[int, int, str, dict[str, Any]]]:
    return [(p, lsn, eid, json.loads(payload)) for p, lsn, eid, payload in query(
        dsn, "SELECT partition, lsn, event_id, payload FROM airflow_txn.log_events WHERE log_name = 'big' "
             "ORDER BY partition, lsn")]


def oracle(n: int) -> tuple[Counter[str], Counter[str]]:
    counts, amounts = Counter[str](), Counter[str]()
    for i in range(n):
        rec = json.loads(click(i)[1])
        counts[rec["user"]] += 1
        if rec["amount"] >= BIG:
            amounts[rec["user"]] += rec["amount"]
    return counts, amounts


def test_two_stages_chain_exactly_once_through_an_output_log(dsn: str) -> None:
    coord = Coordinator(dsn)
    source = make_log(dsn, partitions=3)
    coord.register(stage1())
    coord.register(stage2())
    source.append(clicks(0, 40))
    txids = drain(coord, "stage1", stage1_fn, "a")
    # Every txid processed twice more before its commit: extra attempts append nothing.
    source.append(clicks(40, 80))
    for n in range(100):
        txn = coord.plan("stage1", f"b{n}")
        if txn.empty:
            coord.commit("stage1", txn.txid)
            break
        for _ in range(3):
            process_batch(coord, "stage1", txn.txid, stage1_fn)
        assert big_events(dsn) and len(big_events(dsn)) < 80  # staged, not appended
        before = len(big_events(dsn))
        coord.commit("stage1", txn.txid)
        assert coord.commit("stage1", txn.txid).committed is False  # a second commit is a no-op
        assert len(big_events(dsn)) >= before
        txids.append(txn.txid)
    drain(coord, "stage2", stage2_fn, "c")

    counts, amounts = oracle(80)
    assert {u: v for u, v, _ in query(dsn, "SELECT * FROM s1_count")} == counts
    assert {u: v for u, v, _ in query(dsn, "SELECT * FROM s2_amount")} == amounts
    events = big_events(dsn)
    assert sorted(e[3]["i"] for e in events) == [i for i in range(80) if json.loads(click(i)[1])["amount"] >= BIG]
    assert len({e[2] for e in events}) == len(events)
    assert all(e[2].startswith("stage1:") for e in events)
    # A user's events share a partition, and each partition's LSNs are dense from 1.
    for p in (0, 1):
        assert [e[1] for e in events if e[0] == p] == list(range(1, 1 + sum(e[0] == p for e in events)))
    assert all(len({e[0] for e in events if e[3]["user"] == u}) == 1 for u in amounts)
    # The log follows txid order: in each partition, the txid that emitted an event never goes back.
    origin_txid = _txid_of_source_events(dsn)
    for p in (0, 1):
        emitted_by = [origin_txid[e[3]["i"]] for e in events if e[0] == p]
        assert emitted_by == sorted(emitted_by)
    assert query(dsn, "SELECT count(*) FROM airflow_txn.out_1") == [(0,)]  # staging cleaned at commit


def _txid_of_source_events(dsn: str) -> dict[int, int]:
    """Source event number -> the stage-1 txid that committed it (from the commit log's offsets)."""
    ranges = query(dsn, "SELECT txid, start_offsets, end_offsets FROM airflow_txn.commits "
                        "WHERE topology_id = 'stage1'")
    out = {}
    for p, lsn, payload in query(dsn, "SELECT partition, lsn, payload FROM airflow_txn.log_events "
                                      "WHERE log_name = 'clicks'"):
        for txid, start, end in ranges:
            if int(start.get(str(p), 0)) < lsn <= int(end.get(str(p), 0)):
                out[json.loads(payload)["i"]] = txid
    return out


@pytest.mark.parametrize("point", ["commit.after_append", "commit.after_checkpoint", "commit.before_commit"])
def test_a_commit_that_fails_after_appending_appends_nothing(dsn: str, point: str) -> None:
    coord = Coordinator(dsn)
    make_log(dsn).append(clicks(0, 30))
    coord.register(stage1(max_batch_size=100))
    txn = coord.plan("stage1", "a")
    process_batch(coord, "stage1", txn.txid, stage1_fn)
    with faults.inject(point, "raise"), pytest.raises(faults.InjectedFault):
        coord.commit("stage1", txn.txid)
    assert big_events(dsn) == []
    assert query(dsn, "SELECT next_lsn FROM airflow_txn.log_partitions WHERE log_name = 'big'") == [(1,), (1,)]
    assert query(dsn, "SELECT count(*) FROM s1_count") == [(0,)]
    coord.commit("stage1", txn.txid)
    assert len(big_events(dsn)) == sum(json.loads(click(i)[1])["amount"] >= BIG for i in range(30))


def test_events_emitted_again_after_a_reset_are_not_appended_twice(dsn: str) -> None:
    coord = Coordinator(dsn)
    make_log(dsn).append(clicks(0, 30))
    coord.register(stage1())
    drain(coord, "stage1", stage1_fn, "a")
    first = big_events(dsn)
    coord.reset("stage1")
    coord.register(stage1())
    drain(coord, "stage1", stage1_fn, "b")
    assert big_events(dsn) == first
    assert query(dsn, "SELECT sum(value) FROM s1_count") == [(30,)]


def test_one_attempt_emitting_an_id_twice_keeps_the_first_and_bad_payloads_are_quarantined(dsn: str) -> None:
    coord = Coordinator(dsn)
    make_log(dsn, partitions=1).append(clicks(0, 6))

    def fn(rec: dict[str, Any]) -> list[Any]:
        if rec["i"] == 4:
            return [OutputEvent("big", "nul \x00 byte")]
        return [("s1_count", (rec["user"],), 1), OutputEvent("big", {"i": rec["i"]}, id="same")]

    coord.register(stage1(max_batch_size=100))
    txn = coord.plan("stage1", "a")
    result = process_batch(coord, "stage1", txn.txid, fn)
    assert result.row_counts["big"] == 1 and result.quarantined == 1
    coord.commit("stage1", txn.txid)
    assert [(e[2], e[3]) for e in big_events(dsn)] == [("stage1:same", {"i": 0})]
    assert query(dsn, "SELECT source_offset, reason FROM airflow_txn.quarantine")[0][1].startswith("BadRecord")


def test_an_event_for_an_undeclared_output_fails_the_attempt_naming_the_outputs(dsn: str) -> None:
    coord = Coordinator(dsn)
    make_log(dsn).append(clicks(0, 3))
    coord.register(stage1())
    txn = coord.plan("stage1", "a")
    with pytest.raises(ConfigError, match=r"has no output 'nope' \(outputs: big\)"):
        process_batch(coord, "stage1", txn.txid, lambda rec: [OutputEvent("nope", "x")])


def test_outputs_may_be_added_to_a_running_topology_but_not_moved_or_dropped(dsn: str) -> None:
    coord = Coordinator(dsn)
    make_log(dsn).append(clicks(0, 3))
    plain = TopologySpec("stage1", PostgresLogSource("clicks"), [StateSpec("s1_count", {"user_id": "text"})])
    coord.register(plain)
    drain(coord, "stage1", lambda rec: [("s1_count", (rec["user"],), 1)], "a")
    coord.register(stage1())  # added: later batches append to it
    with pytest.raises(DeclarationChanged, match="output 'big'"):
        coord.register(TopologySpec("stage1", PostgresLogSource("clicks"),
                                    [StateSpec("s1_count", {"user_id": "text"})],
                                    outputs=[OutputSpec("big", log="elsewhere")]))
    with pytest.raises(DeclarationChanged, match=r"output 'big' .* removed"):
        coord.register(plain)
