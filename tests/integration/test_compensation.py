"""Corrections of a topology with an output log, on a real Postgres: the correction's commit appends
compensating events -- a retraction of each event its txids appended that the fixed code no longer
emits as it was, a new version of each it emits anew or otherwise -- and a second topology reading
that log applies each retraction negated, so both stages end equal to the fixed code's oracle; what
a reader could not take back is refused, naming the reader."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from airflow_transactional import EventLog, OutputEvent
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from tests.helpers import make_log, query, table
from tests.integration.test_output_logs import BIG, clicks, drain, stage1, stage2, stage2_fn

pytestmark = pytest.mark.integration


def buggy(rec: dict[str, Any]) -> list[Any]:
    """The deployed bug: a click of amount 4 passes as big, and u3's amounts go on doubled."""
    amount = int(rec["amount"]) * (2 if rec["user"] == "u3" else 1)
    out: list[Any] = [("s1_count", (rec["user"],), 1)]
    if int(rec["amount"]) >= BIG - 1:
        out.append(OutputEvent("big", {"user": rec["user"], "amount": amount, "i": rec["i"]}, key=rec["user"]))
    return out


def fixed(rec: dict[str, Any]) -> list[Any]:
    out: list[Any] = [("s1_count", (rec["user"],), 1)]
    if int(rec["amount"]) >= BIG:
        out.append(OutputEvent("big", {"user": rec["user"], "amount": int(rec["amount"]), "i": rec["i"]},
                               key=rec["user"]))
    return out


def oracle(fn: Any, n: int) -> dict[str, int]:
    """Stage 2's amounts per user under ``fn``: the sum of the events it passes on."""
    amounts: Counter[str] = Counter()
    for _eid, payload in clicks(0, n):
        for e in fn(json.loads(payload)):
            if isinstance(e, OutputEvent):
                amounts[e.payload["user"]] += e.payload["amount"]
    return {k: v for k, v in amounts.items() if v}


def live_events(dsn: str, log: str = "big") -> dict[str, dict[str, Any]]:
    """A log as a reader ends up with it: by origin, the last version, retractions applied."""
    live: dict[str, dict[str, Any]] = {}
    for eid, payload, origin, retraction in query(
            dsn, "SELECT e.event_id, e.payload, v.origin, v.retraction FROM airflow_txn.log_events e "
                 f"LEFT JOIN airflow_txn.log_versions v USING (log_name, event_id) WHERE e.log_name = '{log}' "
                 "ORDER BY coalesce(v.txid, 0), v.retraction DESC NULLS LAST"):
        if retraction:
            assert live.pop(origin) == json.loads(payload)  # a retraction carries what it takes back
        else:
            live[origin or eid] = json.loads(payload)
    return live


def _correct(coord: Coordinator, run_key: str, first: int, last: int) -> int:
    txn = coord.plan_correction("stage1", run_key, first, last)
    process_batch(coord, "stage1", txn.txid, fixed)
    assert coord.commit("stage1", txn.txid).committed
    return txn.txid


def _nonzero(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v}


def _both_stages(dsn: str, coord: Coordinator, n: int, second: Any) -> None:
    """``n`` clicks through stage 1 under the bug, then stage 2 (its record function ``second``)."""
    make_log(dsn, "clicks").append(clicks(0, n))
    coord.register(stage1(max_batch_size=30))
    coord.register(stage2())
    drain(coord, "stage1", buggy, "a")
    drain(coord, "stage2", second, "b")


def test_a_correction_retracts_and_versions_its_events_and_the_next_stage_follows(dsn: str) -> None:
    with Coordinator(dsn) as coord:
        _both_stages(dsn, coord, 90, stage2_fn)
        assert _nonzero(table(dsn, "s2_amount")) == oracle(buggy, 90)
        # The middle txid first: its events are retracted or versioned; stage 2 takes them as new input.
        fix = _correct(coord, "fix-2", 2, 2)
        drain(coord, "stage2", stage2_fn, "c")
        assert _nonzero(table(dsn, "s2_amount")) == _sums(live_events(dsn).values())
        # Then all of it (the correction of txid 2 inside: counted once), and stage 2 again.
        again = _correct(coord, "fix-all", 1, 3)
        drain(coord, "stage2", stage2_fn, "d")
        fixed_events = {f"stage1:{eid}:0": e.payload for eid, payload in clicks(0, 90)
                        for e in fixed(json.loads(payload))[1:]}
        assert live_events(dsn) == fixed_events
        assert _nonzero(table(dsn, "s2_amount")) == oracle(fixed, 90)
        kinds = Counter(bool(r) for (r,) in query(dsn, "SELECT retraction FROM airflow_txn.log_versions"))
        assert kinds[True] > 0 and kinds[False] > 0  # amount-4 clicks retracted; u3's events versioned
        # A correction under the same code again appends nothing: there is nothing left to compensate.
        last = _correct(coord, "same", 1, 3)
        assert coord.commits("stage1")[-1]["row_counts"]["big"] == 0
        assert query(dsn, f"SELECT count(*) FROM airflow_txn.output_ranges WHERE txid = {last}") == [(0,)]
        assert fix < again < last
        # Stage 1's own state never changed: the bug was in what it passed on.
        assert coord.changes("stage1", again) == {"s1_count": []}


def test_a_retraction_quarantined_downstream_is_taken_back_when_replayed(dsn: str) -> None:
    """Stage 2 set u3's events aside (a bug of its own), then the retractions of them: replayed
    after its fix, each event counts once and each retraction takes one back."""
    def picky(rec: dict[str, Any]) -> list[Any]:
        if rec["user"] == "u3":
            raise ValueError("u3 is refused by stage 2's bug")
        return stage2_fn(rec)

    with Coordinator(dsn) as coord:
        _both_stages(dsn, coord, 60, picky)
        _correct(coord, "fix", 1, 2)
        drain(coord, "stage2", picky, "c")
        assert "u3" not in _nonzero(table(dsn, "s2_amount"))
        taken_back = query(dsn, "SELECT count(*) FROM airflow_txn.quarantine q JOIN airflow_txn.log_versions v "
                                "ON v.event_id = q.event_id AND v.retraction WHERE q.topology_id = 'stage2'")
        assert taken_back[0][0] > 0  # u3's retractions were set aside too
        committed = coord.status("stage2").committed_txid
        replay = coord.plan_replay("stage2", "replay", {"txids": f"1..{committed}"})
        process_batch(coord, "stage2", replay.txid, stage2_fn)
        coord.commit("stage2", replay.txid)
        assert _nonzero(table(dsn, "s2_amount")) == oracle(fixed, 60)


def _sums(events: Any, times: int = 1) -> dict[str, int]:
    """The events' amounts per user (each ``times`` over), none of zero."""
    amounts: Counter[str] = Counter()
    for e in events:
        amounts[e["user"]] += times * e["amount"]
    return _nonzero(dict(amounts))


def test_a_reader_that_cannot_take_retractions_back_refuses_the_correction(dsn: str) -> None:
    log = make_log(dsn, "clicks")
    log.append(clicks(0, 30))
    with Coordinator(dsn) as coord:
        coord.register(stage1(max_batch_size=30))
        coord.register(TopologySpec("top", PostgresLogSource("big"),
                                    [StateSpec("s2_max", {"user_id": "text"}, combiner="max")]))
        drain(coord, "stage1", buggy, "a")
        with pytest.raises(ConfigError, match=r"topology 'top' reads its output events .* s2_max \(max\)"):
            coord.plan_correction("stage1", "fix", 1, 1)


def test_retention_of_the_appended_events_refuses_the_correction(dsn: str) -> None:
    make_log(dsn, "clicks").append(clicks(0, 30))
    with Coordinator(dsn) as coord:
        coord.register(stage1(max_batch_size=30))
        drain(coord, "stage1", buggy, "a")
        for p, head in query(dsn, "SELECT partition, max(lsn) FROM airflow_txn.log_events WHERE log_name = 'big' "
                                  "GROUP BY 1"):
            EventLog(dsn, "big").truncate(p, head, force=True)
        with pytest.raises(ConfigError, match=r"retention removed output events its txids appended.*txid 1: log "
                                              r"'big' partition \d LSN 1\.\.\d"):
            coord.plan_correction("stage1", "fix", 1, 1)
