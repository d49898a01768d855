"""A state kept in another Postgres database is not atomic with the checkpoint: it stays exact
through the per-value txid rule, and a commit that dies between the two databases is finished by
a rerun with the same (pinned) attempt -- a correction's too, whose differences are made once, at
the pin, before they are applied there."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from dev import faults
from dev.embedded import EmbeddedPostgres
from tests.helpers import click, make_log, query

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind", ["transactional", "opaque"])
def test_commit_dying_between_databases_is_finished_exactly_once(pg: EmbeddedPostgres, dsn: str,
                                                                 kind: str) -> None:
    other_name = f"t_ext_{uuid.uuid4().hex[:8]}"
    other = pg.create_database(other_name)
    spec = TopologySpec("clicks", PostgresLogSource("clicks"), [
        StateSpec("local_count", {"user_id": "text"}, combiner="count", kind=kind),
        StateSpec("remote_count", {"user_id": "text"}, combiner="count", kind=kind, database="reporting"),
    ], max_batch_size=30)
    coord = Coordinator(dsn, external_dsns={"reporting": other})
    log = make_log(dsn)
    coord.register(spec)
    log.append([click(i) for i in range(60)])

    def fn(r):  # type: ignore[no-untyped-def]
        return [("local_count", (r["user"],), 1), ("remote_count", (r["user"],), 1)]

    for run in ("a", "b"):
        txn = coord.plan("clicks", run)
        process_batch(coord, "clicks", txn.txid, fn)
        code = ("from airflow_transactional.coordinator import Coordinator;"
                f"Coordinator({dsn!r}, external_dsns={{'reporting': {other!r}}}).commit('clicks', {txn.txid})")
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                               env=faults.child_env(faults="commit.after_external=exit"))
        assert child.returncode == 137
        # The remote state has txid N applied; the checkpoint has not moved.
        assert query(other, "SELECT max(txid) FROM remote_count") == [(txn.txid,)]
        assert coord.status("clicks").committed_txid == txn.txid - 1
        # Meanwhile someone replays processing: a newer attempt must not change what is applied.
        process_batch(coord, "clicks", txn.txid, fn)
        assert coord.commit("clicks", txn.txid).committed
    remote = dict(query(other, "SELECT user_id, value FROM remote_count"))
    local = dict(query(dsn, "SELECT user_id, value FROM local_count"))
    assert remote == local and sum(remote.values()) == 60
    coord.close()
    log.close()
    pg.drop_database(other_name)


def _buggy(r: dict[str, Any]) -> list[Any]:
    amount = r["amount"] * (2 if r["user"] == "u3" else 1)
    return [("local_sum", (r["user"],), amount), ("remote_sum", (r["user"],), amount)]


def _fixed(r: dict[str, Any]) -> list[Any]:
    return [("local_sum", (r["user"],), r["amount"]), ("remote_sum", (r["user"],), r["amount"])]


def test_a_correction_of_a_state_in_another_database_dying_between_them_applies_its_differences_once(
        pg: EmbeddedPostgres, dsn: str) -> None:
    other_name = f"t_ext_{uuid.uuid4().hex[:8]}"
    other = pg.create_database(other_name)
    spec = TopologySpec("clicks", PostgresLogSource("clicks"), [
        StateSpec("local_sum", {"user_id": "text"}),
        StateSpec("remote_sum", {"user_id": "text"}, database="reporting")], max_batch_size=30)
    coord = Coordinator(dsn, external_dsns={"reporting": other})
    log = make_log(dsn)
    coord.register(spec)
    log.append([click(i) for i in range(60)])

    for run in ("a", "b"):
        txn = coord.plan("clicks", run)
        process_batch(coord, "clicks", txn.txid, _buggy)
        coord.commit("clicks", txn.txid)
    fix = coord.plan_correction("clicks", "fix", 1, 2)
    process_batch(coord, "clicks", fix.txid, _fixed)
    for point in ("commit.after_pin", "commit.after_external"):
        code = ("from airflow_transactional.coordinator import Coordinator;"
                f"Coordinator({dsn!r}, external_dsns={{'reporting': {other!r}}}).commit('clicks', {fix.txid})")
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                               env=faults.child_env(faults=f"{point}=exit"))
        assert child.returncode == 137, child.stderr[-2000:]
        assert coord.status("clicks").committed_txid == fix.txid - 1
    process_batch(coord, "clicks", fix.txid, _buggy)  # a newer attempt changes nothing: one is pinned
    assert coord.commit("clicks", fix.txid).committed
    oracle: dict[str, int] = {}
    for i in range(60):
        r = json.loads(click(i)[1])
        oracle[r["user"]] = oracle.get(r["user"], 0) + r["amount"]
    remote = dict(query(other, "SELECT user_id, value FROM remote_sum"))
    assert remote == dict(query(dsn, "SELECT user_id, value FROM local_sum")) == oracle
    # Its history holds the differences, as the local state's does.
    assert coord.changes("clicks", fix.txid)["remote_sum"] == coord.changes("clicks", fix.txid)["local_sum"] != []
    coord.close()
    log.close()
    pg.drop_database(other_name)


def _picky(r: dict[str, Any]) -> list[Any]:
    if r["amount"] == 7:
        raise ValueError("sevens are refused by this bug")
    return _fixed(r)


def test_a_replay_of_quarantined_records_counts_them_in_another_database_once(pg: EmbeddedPostgres,
                                                                                dsn: str) -> None:
    other_name = f"t_ext_{uuid.uuid4().hex[:8]}"
    other = pg.create_database(other_name)
    coord = Coordinator(dsn, external_dsns={"reporting": other})
    log = make_log(dsn)
    coord.register(TopologySpec("clicks", PostgresLogSource("clicks"), [
        StateSpec("local_sum", {"user_id": "text"}),
        StateSpec("remote_sum", {"user_id": "text"}, database="reporting")], max_batch_size=30))
    log.append([click(i) for i in range(60)])
    for run in ("a", "b"):
        txn = coord.plan("clicks", run)
        process_batch(coord, "clicks", txn.txid, _picky)
        coord.commit("clicks", txn.txid)
    replay = coord.plan_replay("clicks", "replay", {"txids": "1..2"})
    process_batch(coord, "clicks", replay.txid, _fixed)
    assert coord.commit("clicks", replay.txid).committed
    totals: dict[str, int] = {}
    for i in range(60):
        r = json.loads(click(i)[1])
        totals[r["user"]] = totals.get(r["user"], 0) + r["amount"]
    assert dict(query(other, "SELECT user_id, value FROM remote_sum")) == totals
    assert dict(query(dsn, "SELECT user_id, value FROM local_sum")) == totals
    coord.close()
    log.close()
    pg.drop_database(other_name)


def test_unconfigured_external_database_names_the_fix(dsn: str) -> None:
    spec = TopologySpec("clicks", PostgresLogSource("clicks"), [
        StateSpec("remote_count", {"user_id": "text"}, database="reporting")])
    make_log(dsn)
    with pytest.raises(Exception, match=r"external_dsns=\{'reporting': dsn\}"):
        Coordinator(dsn).register(spec)
