"""core/history.py: every commit keeps its deltas and says what produced them; the store answers what
a txid changed and what a state held as of a txid -- through retries, a recover, retention and a
rebuild, on a real Postgres."""

from __future__ import annotations

import collections
import io
import json
from typing import Any

import psycopg2
import psycopg2.sql
import pytest

from airflow_transactional import cli, provenance
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import rebuild
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.processing import process_batch
from airflow_transactional.sources.pglog import PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from tests.helpers import click, click_fn, counting_topology, make_log, query, run_one, table

pytestmark = pytest.mark.integration


def _oracle(events: list[tuple[str, str]], txids: dict[str, int], through: int) -> dict[str, int]:
    """Per-user sums of the events committed through ``through`` (each event's txid from the log's order)."""
    sums: dict[str, int] = collections.Counter()
    for event_id, payload in events:
        if txids.get(event_id, through + 1) <= through:  # planned in a txid through it
            rec = json.loads(payload)
            sums[rec["user"]] += int(rec["amount"])
    return dict(sums)


def _txid_of_events(dsn: str) -> dict[str, int]:
    """Which txid read each event: the committed batches' LSN ranges against the log."""
    rows = query(dsn, "SELECT txid, batch FROM airflow_txn.transactions WHERE topology_id = 'clicks'")
    found = {}
    for txid, batch in rows:
        for partition, start, end in batch["ranges"]:
            for (event_id,) in query(dsn, "SELECT event_id FROM airflow_txn.log_events WHERE log_name = 'clicks' "
                                          "AND partition = %s AND lsn > %s AND lsn <= %s", (partition, start, end)):
                found[event_id] = txid
    return found


def test_each_commit_keeps_its_deltas_and_the_state_as_of_any_txid_adds_up(dsn: str) -> None:
    events = [click(i) for i in range(120)]
    make_log(dsn).append(events)
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=30))
        for n in range(4):
            txn = coord.plan("clicks", f"r{n}")
            if n == 1:  # a failed try and a second complete attempt: only the committed one is history
                process_batch(coord, "clicks", txn.txid, click_fn)
            process_batch(coord, "clicks", txn.txid, click_fn)
            coord.commit("clicks", txn.txid)
        coord.recover("clicks")  # what can never commit goes; the history stays
        txids = _txid_of_events(dsn)
        for through in range(0, 5):
            state = dict(coord.state_as_of("clicks", "clicks_amount", through))
            assert state == _oracle(events, txids, through), through
        assert dict(coord.state_as_of("clicks", "clicks_amount", 4)) == table(dsn, "clicks_amount")
        # What txid 3 changed, per key: the difference between the states as of 2 and 3.
        before, after = (dict(coord.state_as_of("clicks", "clicks_amount", t)) for t in (2, 3))
        changed = dict(coord.changes("clicks", 3)["clicks_amount"])
        assert changed == {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        log = coord.commits("clicks")
        assert [r["attempt"] for r in log] == [1, 2, 1, 1]
        for r in log:
            rows, _hash = r["digests"]["clicks_amount"].split(":")
            assert int(rows) == len(coord.changes("clicks", r["txid"])["clicks_amount"])
            assert r["code"]["provider"] == provenance.provider_digest()
            assert r["code"]["declaration"] == provenance.declaration_digest(coord.spec("clicks").to_config())
        with pytest.raises(ConfigError, match="txid 5 is not committed"):
            coord.state_as_of("clicks", "clicks_amount", 5)


def test_equal_deltas_have_equal_digests_whatever_their_order(dsn: str) -> None:
    """The digest is a property of the deltas: the same batch processed again digests the same, and
    another batch does not."""
    make_log(dsn).append([click(i) for i in range(40)])
    make_log(dsn, "mirror").append([click(i) for i in reversed(range(40))])
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=40))
        coord.register(counting_topology("mirror", log="mirror", max_batch_size=40))
        run_one(coord, "clicks", "a")
        run_one(coord, "mirror", "a", fn=lambda rec: [(f"mirror_{s[7:]}", k, v) for s, k, v in click_fn(rec)])
        run_one(coord, "clicks", "b")
        [first, empty] = coord.commits("clicks")
        [mirrored] = coord.commits("mirror")
        assert first["digests"]["clicks_amount"] == mirrored["digests"]["mirror_amount"]
        assert first["digests"]["clicks_count"] != first["digests"]["clicks_amount"]
        assert empty["digests"] == {}


def test_retention_folds_old_txids_into_a_snapshot_and_refuses_what_it_removed(dsn: str) -> None:
    events = [click(i) for i in range(100)]
    make_log(dsn).append(events)
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=20))
        for n in range(5):
            run_one(coord, "clicks", f"r{n}")
        as_of_4 = coord.state_as_of("clicks", "clicks_count", 4)
        before = coord.history_sizes("clicks")["clicks_count"].deltas
        assert coord.compact_history("clicks", 2) == 3
        assert coord.compact_history("clicks", 2) is None  # nothing more to fold
        assert coord.history_sizes("clicks")["clicks_count"].deltas < before
        assert coord.state_as_of("clicks", "clicks_count", 4) == as_of_4
        assert dict(coord.state_as_of("clicks", "clicks_count", 5)) == table(dsn, "clicks_count")
        with pytest.raises(ConfigError, match="the delta history starts after txid 3"):
            coord.state_as_of("clicks", "clicks_count", 2)
        with pytest.raises(ConfigError, match="txid 3 is no longer there"):
            coord.changes("clicks", 3)
        assert coord.changes("clicks", 4)["clicks_count"]


def test_a_history_that_began_late_needs_a_snapshot(dsn: str) -> None:
    make_log(dsn).append([click(i) for i in range(60)])
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=20))
        run_one(coord, "clicks", "r0")
        # As a topology that committed before the history was kept (the migration's mark).
        query(dsn, "UPDATE airflow_txn.topologies SET history_from_txid = 1, history_base = false")
        run_one(coord, "clicks", "r1")
        with pytest.raises(ConfigError, match=r"no snapshot.*history clicks --snapshot"):
            coord.state_as_of("clicks", "clicks_count", 2)
        assert coord.changes("clicks", 2)["clicks_count"]  # a txid after the mark is there
        assert coord.history_snapshot("clicks") == 2
        run_one(coord, "clicks", "r2")
        assert dict(coord.state_as_of("clicks", "clicks_count", 3)) == table(dsn, "clicks_count")


def test_the_command_line_shows_the_history(dsn: str, capsys: Any) -> None:
    make_log(dsn).append([click(i, user=f"u{i % 2}", amount=1) for i in range(10)])
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=6))
        run_one(coord, "clicks", "r0")
        after_first = table(dsn, "clicks_amount")
        run_one(coord, "clicks", "r1")
        second = dict(coord.changes("clicks", 2)["clicks_count"])
    base = ["--dsn", dsn]
    assert cli.main([*base, "state", "clicks", "clicks_amount", "--as-of", "1", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["user_id"]: r["value"] for r in lines} == after_first
    assert cli.main([*base, "changes", "clicks", "2", "--state", "clicks_count"]) == 0
    out = capsys.readouterr().out
    assert f"# state clicks_count: {len(second)} keys changed by txid 2" in out
    assert all(f"{user}\t{n}" in out for user, n in second.items())
    assert cli.main([*base, "commits", "clicks"]) == 0
    out = capsys.readouterr().out
    assert "clicks_amount 2:" in out and f"prov {provenance.provider_digest()[:12]}" in out
    assert cli.main([*base, "state", "clicks", "clicks_amount", "--as-of", "9"]) == 1
    assert "txid 9 is not committed" in capsys.readouterr().err


def test_each_states_history_is_a_sql_view_made_at_registration(dsn: str, capsys: Any) -> None:
    make_log(dsn).append([click(i) for i in range(30)])
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=10))
        for n in range(3):
            run_one(coord, "clicks", f"r{n}")
        view = coord.history_views("clicks")["clicks_amount"]
        changes = {t: sorted(coord.changes("clicks", t)["clicks_amount"]) for t in (1, 2, 3)}
        assert cli.main(["--dsn", dsn, "history", "clicks"]) == 0
        assert f"in SQL: {view} (txid, keys, delta)" in capsys.readouterr().out
        for t, want in changes.items():
            assert sorted(query(dsn, f"SELECT user_id, delta FROM {view} WHERE txid = {t}")) == want
        as_of = dict(query(dsn, f"SELECT user_id, sum(delta) FROM {view} WHERE txid <= 2 GROUP BY 1"))
        assert as_of == dict(coord.state_as_of("clicks", "clicks_amount", 2))
        coord.reset("clicks")  # a reset drops the views with the staging tables
        assert query(dsn, f"SELECT to_regclass('{view}')") == [(None,)]


def test_a_sum_set_aside_at_commit_is_not_in_the_history(dsn: str) -> None:
    """A key whose sum would leave its type is quarantined at the commit: the history holds what was
    applied, so the state as of the txid still equals the table."""
    log = make_log(dsn, "big")
    log.append([("e1", json.dumps({"user": "a", "amount": 2**31 - 10})),
                ("e2", json.dumps({"user": "b", "amount": 1}))])
    spec = TopologySpec("big", PostgresLogSource("big"),
                        [StateSpec("big_sum", {"user_id": "text"}, combiner="sum", value_type="integer")])
    with Coordinator(dsn) as coord:
        coord.register(spec)

        def fn(rec: dict[str, Any]) -> list[tuple[str, tuple[Any, ...], Any]]:
            return [("big_sum", (rec["user"],), int(rec["amount"]))]

        run_one(coord, "big", "r0", fn)
        log.append([("e3", json.dumps({"user": "a", "amount": 100})), ("e4", json.dumps({"user": "b", "amount": 2}))])
        run_one(coord, "big", "r1", fn)
        assert table(dsn, "big_sum") == {"a": 2**31 - 10, "b": 3}
        assert dict(coord.changes("big", 2)["big_sum"]) == {"b": 2}
        assert dict(coord.state_as_of("big", "big_sum", 2)) == table(dsn, "big_sum")


def test_a_rebuild_makes_what_it_recomputed_the_snapshot_the_history_starts_at(dsn: str) -> None:
    make_log(dsn).append([click(i) for i in range(60)])
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=20))
        run_one(coord, "clicks", "r0")
        run_one(coord, "clicks", "r1")
        started = rebuild.begin(coord.store, "clicks")  # as the engine's Rebuild begins (core/recompute.py)
        run_one(coord, "clicks", "r2")  # committed while the rebuild runs: its journal
        recomputed = {s: {k: 2 * v for k, v in coord.state_as_of("clicks", s, 2)} for s in ("clicks_count",
                                                                                           "clicks_amount")}
        for name, copy in rebuild.load_copies(coord.store, "clicks").items():  # what the rebuild's Spark job loads
            text = "".join(f"{k},{v}\n" for k, v in recomputed[name].items())
            with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                cur.copy_expert(copy, io.StringIO(text))
        third = dict(coord.changes("clicks", 3)["clicks_count"])
        rebuild.swap(coord.store, started)
        assert dict(coord.state_as_of("clicks", "clicks_count", 2)) == recomputed["clicks_count"]
        assert dict(coord.state_as_of("clicks", "clicks_count", 3)) == table(dsn, "clicks_count")
        assert dict(coord.changes("clicks", 3)["clicks_count"]) == third
        with pytest.raises(ConfigError, match="txid 2 is no longer there"):
            coord.changes("clicks", 2)


def test_an_empty_txid_records_the_code_that_committed_it(dsn: str) -> None:
    """Regression: a txid with nothing to read (a run with nothing new, a withdrawn correction)
    committed with no code at all; it records the provider and the declaration that committed it."""
    make_log(dsn).append([click(i) for i in range(5)])
    with Coordinator(dsn) as coord:
        coord.register(counting_topology())
        run_one(coord, "clicks", "r1")
        empty = coord.plan("clicks", "r2")
        assert empty.empty and coord.commit("clicks", empty.txid).committed
        first, second = coord.commits("clicks")
        declared = provenance.declaration_digest(coord.spec("clicks").to_config())
    assert not second["attempt"] and second["records_read"] == 0
    assert second["code"] == {"provider": provenance.provider_digest(), "declaration": declared}
    assert {k: first["code"][k] for k in ("provider", "declaration")} == second["code"]
