"""Corrections through three stages, on a real Postgres: stage 1 (a bug, then two fixes) appends to
log ``big``; ``mid`` reads it and appends events of its own to log ``relay`` (one under an id made
from the event it read, one under an explicit id); ``last`` sums ``relay``. A correction of stage 1
retracts and versions its events; ``mid`` takes each retraction back and retracts the events it
had emitted for it in turn, versions the ones it emits again -- so ``last`` ends equal to the
fixed code's oracle, whether ``mid`` reads the corrections as they come or lags behind two of them
and the original events at once (what cancels out within a batch is not applied)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from airflow_transactional import OutputEvent
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spec import OutputSpec, StateSpec, TopologySpec
from tests.helpers import make_log, query, table
from tests.integration.test_compensation import _nonzero, _sums, buggy, fixed, live_events
from tests.integration.test_output_logs import clicks, drain, stage1

pytestmark = pytest.mark.integration


def fixed_again(rec: dict[str, Any]) -> list[Any]:
    """A second fix: u2's amounts were a hundred short."""
    out = fixed(rec)
    for e in out[1:]:
        if e.payload["user"] == "u2":
            out[out.index(e)] = OutputEvent("big", {**e.payload, "amount": e.payload["amount"] + 100}, key=e.key)
    return out


def mid_fn(rec: dict[str, Any]) -> list[Any]:
    return [("m_amount", (rec["user"],), rec["amount"]),
            OutputEvent("relay", {"user": rec["user"], "amount": 10 * rec["amount"]}, key=rec["user"]),
            OutputEvent("relay", {"user": rec["user"], "amount": rec["amount"], "x": True}, id=f"x{rec['i']}")]


def last_fn(rec: dict[str, Any]) -> list[Any]:
    return [("l_amount", (rec["user"],), rec["amount"])]


def _correct(coord: Coordinator, run_key: str, first: int, last: int, fn: Any) -> None:
    txn = coord.plan_correction("stage1", run_key, first, last)
    process_batch(coord, "stage1", txn.txid, fn)
    assert coord.commit("stage1", txn.txid).committed


def _downstream(coord: Coordinator, runs: str) -> None:
    drain(coord, "mid", mid_fn, f"m{runs}")
    drain(coord, "last", last_fn, f"l{runs}")


def _three_stages(dsn: str, coord: Coordinator, n: int) -> None:
    make_log(dsn, "clicks").append(clicks(0, n))
    coord.register(stage1(max_batch_size=30))
    coord.register(TopologySpec("mid", PostgresLogSource("big"), [StateSpec("m_amount", {"user_id": "text"})],
                                outputs=[OutputSpec("relay", partitions=2)], max_batch_size=1000))
    coord.register(TopologySpec("last", PostgresLogSource("relay"), [StateSpec("l_amount", {"user_id": "text"})],
                                max_batch_size=5))
    drain(coord, "stage1", buggy, "a")


def _agree(dsn: str) -> dict[str, dict[str, Any]]:
    """Each stage's state equals what its input log holds live; ``relay``'s live events."""
    big = live_events(dsn, "big").values()
    assert _nonzero(table(dsn, "m_amount")) == _sums(big)
    relay = live_events(dsn, "relay")
    assert _nonzero(table(dsn, "l_amount")) == _sums(relay.values()) == _sums(big, 11)
    return relay


def test_a_correction_cascades_through_a_reader_with_an_output_log(dsn: str) -> None:
    with Coordinator(dsn) as coord:
        _three_stages(dsn, coord, 90)
        # mid has read nothing yet: its one batch holds txid 2's original events and their retractions.
        _correct(coord, "fix-2", 2, 2, fixed)
        _downstream(coord, "a")
        _agree(dsn)
        # As they come: the whole range fixed, read, then fixed again and read.
        _correct(coord, "fix-all", 1, 3, fixed)
        _downstream(coord, "b")
        _agree(dsn)
        # Lagging behind two corrections: what the first versioned, the second retracts in mid's batch.
        _correct(coord, "fix-more", 1, 3, fixed_again)
        _correct(coord, "fix-again", 1, 3, fixed)
        _correct(coord, "fix-last", 1, 3, fixed_again)
        _downstream(coord, "c")
        relay = _agree(dsn)
        expected = {f"stage1:{eid}:0": e.payload for eid, payload in clicks(0, 90)
                    for e in fixed_again(json.loads(payload))[1:]}
        assert live_events(dsn, "big") == expected
        assert relay == {
            **{f"mid:{eid}:0": {"user": e["user"], "amount": 10 * e["amount"]} for eid, e in expected.items()},
            **{f"mid:x{e['i']}": {"user": e["user"], "amount": e["amount"], "x": True} for e in expected.values()}}
        kinds = Counter(bool(r) for (r,) in query(
            dsn, "SELECT retraction FROM airflow_txn.log_versions WHERE log_name = 'relay' AND topology_id = 'mid'"))
        assert kinds[True] > 0 and kinds[False] > 0  # mid's own events retracted and versioned


def test_a_reader_of_a_reader_that_cannot_take_retractions_back_refuses_the_correction(dsn: str) -> None:
    with Coordinator(dsn) as coord:
        _three_stages(dsn, coord, 30)
        coord.register(TopologySpec("top", PostgresLogSource("relay"),
                                    [StateSpec("t_max", {"user_id": "text"}, combiner="max")]))
        with pytest.raises(ConfigError, match=r"topology 'top' reads its output events .* t_max \(max\) .* "
                                              r"\(it reads the events of 'mid', which reads these\)"):
            coord.plan_correction("stage1", "fix", 1, 1)
