"""No record can stop a topology (the pure-Python processor): whatever a producer appends, the
batch commits, every record is counted or quarantined with its reason, and the states hold what
the oracle computes from the good records alone (tests/hostile.py)."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings

from airflow_transactional import limits
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import EventLog, LandingDirectory, PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from dev.embedded import EmbeddedPostgres
from tests.helpers import query
from tests.hostile import BATCHES, EXAMPLES, counting_fn, oracle

pytestmark = pytest.mark.integration


#: What the landed files of :func:`land_past_the_limits` sum to, their bad lines set aside.
LANDED_SUMS = {"ann": 2, "\U0001f600": 3, "cy": 4}


def land_past_the_limits(directory: Path) -> None:
    """Two landing files: ``a.json`` with a line past the record limit and one escaping a lone
    surrogate among good ones (an escaped pair is fine), then ``b.json``, plain."""
    big = json.dumps({"user": "ann", "amount": 1, "blob": "x" * (limits.MAX_RECORD_BYTES + 2_000_000)})
    (directory / "a.json").write_text("\n".join([json.dumps({"user": "ann", "amount": 2}), big,
                                                 '{"user": "bob", "amount": 1, "note": "\\ud800"}',
                                                 json.dumps({"user": "\ud83d\ude00", "amount": 3})]) + "\n")
    (directory / "b.json").write_text(json.dumps({"user": "cy", "amount": 4}) + "\n")
    os.utime(directory / "a.json", (time.time() - 10, time.time() - 10))  # planned first


def landed_topology(directory: Path, *, max_files: int) -> TopologySpec:
    return TopologySpec("landed", LandingDirectory(str(directory), settle_seconds=0, max_files=max_files), [
        StateSpec("hostile_amount", {"user_id": "text"}, combiner="sum", table="landed_amount")],
        max_quarantined=None)  # hostile batches: mostly bad records, by design


def _topology(name: str) -> TopologySpec:
    return TopologySpec(name, PostgresLogSource(name), [
        StateSpec("hostile_count", {"user_id": "text"}, combiner="count", table=f"{name}_count"),
        StateSpec("hostile_amount", {"user_id": "text"}, combiner="sum", table=f"{name}_amount")],
        max_batch_size=1000, max_quarantined=None)  # hostile batches: mostly bad records, by design


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=BATCHES)
@example(batch=EXAMPLES[0])
@example(batch=EXAMPLES[1])
@example(batch=EXAMPLES[2])
@example(batch=EXAMPLES[3])
@example(batch=EXAMPLES[4])
@example(batch=EXAMPLES[5])
@example(batch=EXAMPLES[6])

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


def test_a_half_megabyte_key_is_quarantined_as_a_prefix_and_the_batch_commits(dsn: str) -> None:
    """The issue's own cases, each a batch that used to fail every attempt: a key of half a
    megabyte (past the index row limit many times over; a record of 50 MB is past the record limit
    and refused at append now), a NUL inside a key, text for a sum, nesting past what the parser's
    recursion survives."""
    import json

    log = EventLog(dsn, "hostile")
    coord = Coordinator(dsn)
    log.create(1)
    batch = [json.dumps({"user": "ann", "amount": 5}), json.dumps({"user": "x" * 500_000, "amount": 1}),
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
    assert "500,000 bytes long, more than the 1,024 allowed" in rows[0][1]
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


def test_a_record_past_the_limit_is_refused_at_append_and_quarantined_from_a_landing_file(
        dsn: str, tmp_path: Path) -> None:
    """Regression: one 200 MB event was appended and committed (1 GB of the worker's memory). A
    record is at most 1 MiB: the log refuses a longer one at append (the client and the door
    alike), and a longer line of a landing file -- a source the provider does not write -- is
    quarantined, its start kept, beside a line escaping a lone surrogate; the file is marked
    not plain, so Spark reads its lines as text and judges them the same way."""
    big = json.dumps({"user": "ann", "amount": 1, "blob": "x" * limits.MAX_RECORD_BYTES})
    log = EventLog(dsn, "big")
    log.create(1)
    done = log.append([("e0", json.dumps({"user": "ann", "amount": 1})), ("e1", big)])
    assert done.appended == 1 and [e for e, _ in done.rejected] == ["e1"]
    assert "more than the 1,048,576 allowed" in done.rejected[0][1]
    door = query(dsn, "SELECT refused FROM airflow_txn.append_events('big', ARRAY[0], ARRAY['e2'], "
                      "ARRAY[repeat('x', 1048577)])")  # another client, past the Python check
    assert door == [(["e2"],)]
    log.close()

    land_past_the_limits(tmp_path)
    coord = Coordinator(dsn)
    coord.register(landed_topology(tmp_path, max_files=1))
    for run in ("r1", "r2"):
        txn = coord.plan("landed", run)
        process_batch(coord, "landed", txn.txid, lambda r: [("hostile_amount", (r["user"],), r["amount"])])
        assert coord.commit("landed", txn.txid).committed
    assert dict(query(dsn, "SELECT user_id, value FROM landed_amount")) == LANDED_SUMS
    rows = query(dsn, "SELECT reason, length(record), left(record, 40) FROM airflow_txn.quarantine ORDER BY id")
    assert [(r[0], r[1]) for r in rows] == [(f"BadRecord: {limits.RECORD_TOO_LARGE}", 4096),
                                           (f"BadRecord: {limits.LONE_SURROGATE}", 46)]
    assert rows[0][2] == '{"user": "ann", "amount": 1, "blob": "xx'  # its start
    assert query(dsn, "SELECT path LIKE '%a.json', plain FROM airflow_txn.landing_files ORDER BY seq") == [
        (True, False), (False, True)]
    coord.close()


def test_an_output_event_its_logs_readers_would_refuse_quarantines_its_record(dsn: str) -> None:
    """An output event is a record of its log: one past the record limit or escaping a lone
    surrogate would be quarantined by every reader of the log, so the record that emitted it is
    quarantined here instead (the Spark helper sets such an event aside:
    tests/spark/test_hostile_records.py)."""
    from airflow_transactional import OutputEvent, OutputSpec

    log = EventLog(dsn, "notes")
    log.create(1)
    log.append([("n1", json.dumps({"note": "fine"})), ("n2", json.dumps({"note": "big"})),
                ("n3", json.dumps({"note": "lone"}))])
    coord = Coordinator(dsn)
    coord.register(TopologySpec("notes", PostgresLogSource("notes"), [
        StateSpec("note_count", {"note": "text"}, combiner="count")], outputs=[OutputSpec("echo")]))
    payloads = {"fine": {"n": 1}, "big": "x" * (limits.MAX_RECORD_BYTES + 1), "lone": {"n": "\ud800"}}

    def fn(r):  # type: ignore[no-untyped-def]
        return [("note_count", (r["note"],), 1), OutputEvent("echo", payloads[r["note"]], id=r["note"])]

    txn = coord.plan("notes", "r1")
    process_batch(coord, "notes", txn.txid, fn)
    assert coord.commit("notes", txn.txid).committed
    assert dict(query(dsn, "SELECT note, value FROM note_count")) == {"fine": 1}
    assert query(dsn, "SELECT event_id FROM airflow_txn.log_events WHERE log_name = 'echo'") == [("notes:fine",)]
    reasons = [r for (r,) in query(dsn, "SELECT reason FROM airflow_txn.quarantine ORDER BY id")]
    assert "more than the 1,048,576 allowed" in reasons[0] and limits.LONE_SURROGATE in reasons[1]
    coord.close()
    log.close()
