"""A state kept in another Postgres database is not atomic with the checkpoint: it stays exact
through the per-value txid rule, and a commit that dies between the two databases is finished by
a rerun with the same (pinned) attempt."""

from __future__ import annotations

import subprocess
import sys
import uuid

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


def test_unconfigured_external_database_names_the_fix(dsn: str) -> None:
    spec = TopologySpec("clicks", PostgresLogSource("clicks"), [
        StateSpec("remote_count", {"user_id": "text"}, database="reporting")])
    make_log(dsn)
    with pytest.raises(Exception, match=r"external_dsns=\{'reporting': dsn\}"):
        Coordinator(dsn).register(spec)
