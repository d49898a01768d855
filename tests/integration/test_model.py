"""Model-based test: random interleavings of append / plan / process attempts / commit / crash /
replay / recover / retention + re-plan, on the real Postgres, checked after every step against an
in-memory oracle that knows every event appended.

The strongest invariant is per event: the ``seen`` state counts each event id, so any event
counted twice, or counted while uncommitted, or missed after the final drain, fails the test.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import psycopg2
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import attempts
from airflow_transactional.exceptions import (
    NotProcessed,
    StaleAttempt,
    TooManyInFlight,
    TransactionalError,
    UnknownTransaction,
    WaitingForPredecessor,
)
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from dev import faults
from tests.helpers import query

pytestmark = pytest.mark.integration

_ids = itertools.count(1)
PARTITIONS = 2
USERS = ["ann", "bob", "cy"]
COMMIT_POINTS = ["commit.after_lock", "commit.after_verify", "commit.after_apply",
                 "commit.after_checkpoint", "commit.before_commit"]
_LOST = re.compile(r"partition (\d+) LSN (\d+)\.\.(\d+)")


class TopologyModel(RuleBasedStateMachine):
    dsn = ""
    opaque = False

    def __init__(self) -> None:
        super().__init__()
        n = next(_ids)
        self.topo = f"m{n}_{'o' if self.opaque else 't'}"
        kind = "opaque" if self.opaque else "transactional"
        self.spec = TopologySpec(self.topo, PostgresLogSource(self.topo), [
            StateSpec(f"{self.topo}_seen", {"event_id": "text"}, combiner="count", kind=kind),
            StateSpec(f"{self.topo}_user", {"user_id": "text"}, combiner="sum", kind=kind),
        ], max_in_flight=3, max_batch_size=7, opaque=self.opaque)
        self.coord = Coordinator(self.dsn)
        self.log = EventLog(self.dsn, self.topo)
        self.log.create(PARTITIONS)
        self.coord.register(self.spec)
        # oracle: per partition, events in LSN order: (event_id, user, amount | None if malformed)
        self.events: list[list[tuple[str, str, int | None]]] = [[] for _ in range(PARTITIONS)]
        self.known_ids: set[str] = set()
        self.truncated = [0] * PARTITIONS
        self.runs = 0
        self.processed_version: dict[int, int] = {}

    def teardown(self) -> None:
        try:
            self._drain()
            self._check(final=True)
        finally:
            self.coord.close()
            self.log.close()

    # -- helpers ---------------------------------------------------------------------------

    def _fn(self, r: dict[str, Any]) -> list[tuple[str, tuple[Any, ...], Any]]:
        return [(f"{self.topo}_seen", (r["id"],), 1), (f"{self.topo}_user", (r["user"],), int(r["amount"]))]

    def _process(self, txid: int) -> None:
        process_batch(self.coord, self.topo, txid, self._fn)
        self.processed_version[txid] = self.coord.transaction(self.topo, txid).plan_version

    def _drain(self) -> None:
        """Plan, process and commit until nothing is in flight or waiting, then one more run -- as
        the next scheduled run does: the lag leaves out what retention removed unread, which only
        a plan past it reports lost (an opaque topology)."""
        last_run = False
        for _ in range(200):
            st_ = self.coord.status(self.topo)
            if not st_.in_flight and st_.lag == 0:
                if last_run:
                    return
                last_run = True
            if not st_.in_flight:
                self.runs += 1
                self.coord.plan(self.topo, f"run{self.runs}")
                continue
            t = st_.in_flight[0].txid
            self._process(t)
            self.coord.commit(self.topo, t)
        raise AssertionError("the topology did not catch up")

    def _lost(self) -> set[tuple[int, int]]:
        rows = query(self.dsn, "SELECT batch FROM airflow_txn.transactions WHERE topology_id = %s "
                               "AND status = 'committed' AND batch ? 'lost'", (self.topo,))
        lost = set()
        for (batch,) in rows:
            for detail in batch["lost"]["detail"]:
                p, a, b = map(int, _LOST.match(detail).groups())  # type: ignore[union-attr]
                lost |= {(p, lsn) for lsn in range(a, b + 1)}
        return lost

    # -- rules -----------------------------------------------------------------------------

    @rule(partition=st.integers(0, PARTITIONS - 1), n=st.integers(1, 9),
          bad=st.booleans(), dup=st.booleans())
    def append(self, partition: int, n: int, bad: bool, dup: bool) -> None:
        batch, fresh = [], []
        for _ in range(n):
            eid = f"e{len(self.known_ids) + len(fresh)}"
            user = USERS[len(self.known_ids) % 3]
            amount = (len(self.known_ids) + len(fresh)) % 5
            batch.append((eid, json.dumps({"id": eid, "user": user, "amount": amount})))
            fresh.append((eid, user, amount))
        if bad:
            eid = f"e{len(self.known_ids) + len(fresh)}"
            batch.append((eid, "{malformed"))
            fresh.append((eid, "", None))
        if dup and self.known_ids:
            batch.append((sorted(self.known_ids)[0], "{}"))  # a duplicate delivery: dropped
        res = self.log.append(batch, partition=partition)
        assert res.appended == len(fresh)
        self.events[partition].extend(fresh)
        self.known_ids |= {e for e, _u, _a in fresh}

    @rule()
    def plan(self) -> None:
        self.runs += 1
        try:
            self.coord.plan(self.topo, f"run{self.runs}")
        except TooManyInFlight:
            assert len(self.coord.status(self.topo).in_flight) >= 3

    @rule(data=st.data(), mode=st.sampled_from(["ok", "ok", "fail", "crash"]))
    def process(self, data: st.DataObject, mode: str) -> None:
        in_flight = self.coord.status(self.topo).in_flight
        if not in_flight:
            return
        txid = data.draw(st.sampled_from([f.txid for f in in_flight]))
        if mode == "ok":
            self._process(txid)
        elif mode == "fail":  # the job failed: partial output staged, attempt marked failed
            attempt, _txn = attempts.begin_attempt(self.coord.store, self.topo, txid)
            self.coord.stage(attempt, f"{self.topo}_seen", [("e0", 3)])
            attempts.fail_attempt(self.coord.store, attempt, "RuntimeError: executor lost")
        else:  # killed mid-write: staged rows, no completion
            attempt, _txn = attempts.begin_attempt(self.coord.store, self.topo, txid)
            self.coord.stage(attempt, f"{self.topo}_seen", [("e0", 5), ("zzz", 7)])

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        st_ = self.coord.status(self.topo)
        top = max([f.txid for f in st_.in_flight] + [st_.committed_txid])
        txid = data.draw(st.integers(1, top + 1))
        committed = st_.committed_txid
        try:
            res = self.coord.commit(self.topo, txid)
        except WaitingForPredecessor:
            assert txid > committed + 1
            return
        except UnknownTransaction:
            assert txid > top  # never planned
            return
        except (NotProcessed, StaleAttempt, TransactionalError) as exc:
            assert txid == committed + 1, exc
            version = self.coord.transaction(self.topo, txid).plan_version
            assert self.processed_version.get(txid) != version, f"processed txid {txid} refused: {exc}"
            return
        if txid <= committed:
            assert not res.committed and "nothing to do" in res.message
        else:
            assert txid == committed + 1 and res.committed

    @rule(point=st.sampled_from(COMMIT_POINTS), action=st.sampled_from(["raise", "terminate"]))
    def crash_commit(self, point: str, action: str) -> None:
        st_ = self.coord.status(self.topo)
        before = st_.committed_txid
        with faults.inject(point, action):
            try:
                self.coord.commit(self.topo, before + 1)
            except (faults.InjectedFault, psycopg2.Error, TransactionalError):
                pass
        assert self.coord.status(self.topo).committed_txid in (before, before + 1)

    @rule()
    def recover(self) -> None:
        self.coord.recover(self.topo)

    @rule(partition=st.integers(0, PARTITIONS - 1), frac=st.floats(0, 1))
    def retention(self, partition: int, frac: float) -> None:
        if not self.opaque:
            return
        head = len(self.events[partition])
        through = self.truncated[partition] + int((head - self.truncated[partition]) * frac)
        self.log.truncate(partition, through, force=True)  # opaque: retention outruns the readers
        self.truncated[partition] = max(self.truncated[partition], through)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def state_matches_oracle(self) -> None:
        self._check(final=False)

    def _check(self, final: bool) -> None:
        st_ = self.coord.status(self.topo)
        offsets = st_.committed_offsets
        lost = self._lost()
        assert all(lsn <= self.truncated[p] for p, lsn in lost)  # only what retention removed
        committed_events = [ev for p in range(PARTITIONS)
                            for lsn, ev in enumerate(self.events[p], start=1)
                            if lsn <= int(offsets.get(str(p), 0)) and (p, lsn) not in lost]
        if final:
            assert len(committed_events) + len(lost) == sum(map(len, self.events))
        seen = dict(query(self.dsn, f"SELECT event_id, value FROM {self.topo}_seen"))
        assert set(seen.values()) <= {1}, "an event was counted twice"
        good = [ev for ev in committed_events if ev[2] is not None]
        assert set(seen) == {e for e, _u, _a in good}
        per_user: dict[str, int] = {}
        for _e, u, a in good:
            per_user[u] = per_user.get(u, 0) + a  # type: ignore[operator]
        assert dict(query(self.dsn, f"SELECT user_id, value FROM {self.topo}_user")) == per_user
        assert st_.quarantined == sum(1 for ev in committed_events if ev[2] is None)
        audit = [t for (t,) in query(self.dsn, "SELECT txid FROM airflow_txn.commits WHERE topology_id = %s "
                                               "ORDER BY committed_at", (self.topo,))]
        assert audit == list(range(1, st_.committed_txid + 1))
        assert st_.lost_records == len(lost)


SETTINGS = settings(max_examples=20, stateful_step_count=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.parametrize("opaque", [False, True], ids=["transactional", "opaque"])
def test_random_interleavings_match_the_oracle(dsn: str, opaque: bool) -> None:
    machine = type(f"Model_{opaque}", (TopologyModel,), {"dsn": dsn, "opaque": opaque})
    run_state_machine_as_test(machine, settings=SETTINGS)
