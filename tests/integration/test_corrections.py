"""core/corrections.py on a real Postgres: committed txids re-processed under fixed code commit their
difference as the next txid -- the state then equals the fixed code's oracle, every key's history
adds up, a correction killed mid-commit commits once, bad records the fix counts are counted once --
and what a correction must not do is refused, naming why."""

from __future__ import annotations

import collections
import json
from typing import Any

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import BatchUnavailable, ConfigError, NonDeterministic
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import LandingDirectory
from airflow_transactional.sources.landed import write_json_lines
from airflow_transactional.sources.pglog import PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from tests.helpers import click, counting_topology, make_log, query, run_one, table
from tests.integration.test_crash_points import _commit_in_child

pytestmark = pytest.mark.integration

Rows = list[tuple[str, tuple[Any, ...], Any]]


def buggy(rec: dict[str, Any]) -> Rows:
    """The deployed transform's bug: u3's amounts are counted twice, and a record without an amount fails."""
    amount = int(rec["amount"]) * (2 if rec["user"] == "u3" else 1)
    return [("clicks_count", (rec["user"],), 1), ("clicks_amount", (rec["user"],), amount)]


def fixed(rec: dict[str, Any]) -> Rows:
    amount = int(rec.get("amount") or 0)
    return [("clicks_count", (rec["user"],), 1), ("clicks_amount", (rec["user"],), amount)]


def _oracle(fn: Any, payloads: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    counts: dict[str, int] = collections.Counter()
    amounts: dict[str, int] = collections.Counter()
    for payload in payloads:
        for state, (user,), value in fn(json.loads(payload)):
            (counts if state == "clicks_count" else amounts)[user] += value
    return dict(counts), dict(amounts)


def _correct(coord: Coordinator, run_key: str, first: int, last: int, fn: Any = fixed) -> int:
    txn = coord.plan_correction("clicks", run_key, first, last)
    assert txn.start_offsets == txn.end_offsets  # a correction reads no new records
    process_batch(coord, "clicks", txn.txid, fn)
    assert coord.commit("clicks", txn.txid).committed
    return txn.txid


def _truncate_all(dsn: str, log: Any) -> None:
    """Retention removes every event the log holds."""
    for p, head in query(dsn, "SELECT partition, max(lsn) FROM airflow_txn.log_events GROUP BY 1"):
        log.truncate(p, head, force=True)


def _history_adds_up(coord: Coordinator, dsn: str) -> None:
    """Every key's deltas, originals and corrections, sum to its value in the state table."""
    committed = coord.status("clicks").committed_txid
    sums: dict[str, int] = collections.Counter()
    for txid in range(1, committed + 1):
        for user, delta in coord.changes("clicks", txid)["clicks_amount"]:
            sums[user] += delta
    assert {k: v for k, v in sums.items() if v} == {k: v for k, v in table(dsn, "clicks_amount").items() if v}


def test_a_fixed_transform_corrects_a_range_and_then_all_of_it(dsn: str) -> None:
    events = [click(i) for i in range(80)]
    make_log(dsn).append(events)
    payloads = [p for _e, p in events]
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=20))
        for n in range(4):
            run_one(coord, "clicks", f"r{n}", buggy)
        assert (table(dsn, "clicks_count"), table(dsn, "clicks_amount")) == _oracle(buggy, payloads)
        assert _correct(coord, "fix-2-3", 2, 3) == 5
        # Txids 1 and 4 still hold the bug's deltas, 2..3 the fix's: the states as of each txid say so.
        mixed = {k: v for k, v in table(dsn, "clicks_amount").items()}
        assert mixed != _oracle(buggy, payloads)[1] and mixed != _oracle(fixed, payloads)[1]
        assert _correct(coord, "fix-all", 1, 4) == 6  # holds the correction of 2..3: counted once
        assert (table(dsn, "clicks_count"), table(dsn, "clicks_amount")) == _oracle(fixed, payloads)
        _history_adds_up(coord, dsn)
        [*_, fix_23, fix_all] = coord.commits("clicks")
        assert fix_23["corrects"] == {"txids": [2, 3]} and fix_all["corrects"] == {"txids": [1, 4]}
        assert fix_all["row_counts"]["clicks_count"] == 0  # the bug never touched the counts
        # Under the same code again a correction changes nothing: the job is deterministic.
        again = _correct(coord, "same-code", 1, 4)
        assert coord.changes("clicks", again) == {"clicks_count": [], "clicks_amount": []}
        assert dict(coord.state_as_of("clicks", "clicks_amount", 4)) == _oracle(buggy, payloads)[1]


def test_a_correction_waits_its_turn_behind_txids_in_flight_and_is_planned_once(dsn: str) -> None:
    log = make_log(dsn)
    log.append([click(i) for i in range(40)])
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=20))
        run_one(coord, "clicks", "r0", buggy)
        run_one(coord, "clicks", "r1", buggy)
        log.append([click(i) for i in range(40, 60)])
        later = coord.plan("clicks", "r2")  # in flight when the correction is planned
        fix = coord.plan_correction("clicks", "fix", 1, 2)
        assert fix.txid == later.txid + 1 and fix.start_offsets == later.end_offsets
        assert coord.plan_correction("clicks", "fix", 1, 2) == fix  # a retried plan task gets the same
        with pytest.raises(ConfigError, match=r"not a correction of txids 1\.\.1"):
            coord.plan_correction("clicks", "fix", 1, 1)
        process_batch(coord, "clicks", fix.txid, fixed)
        process_batch(coord, "clicks", later.txid, fixed)  # new records under the fixed code
        with pytest.raises(Exception, match=r"txid 3"):
            coord.commit("clicks", fix.txid)
        coord.commit("clicks", later.txid)
        coord.commit("clicks", fix.txid)
        payloads = [p for _e, p in [click(i) for i in range(60)]]
        assert table(dsn, "clicks_amount") == _oracle(fixed, payloads)[1]
        run_one(coord, "clicks", "r3", fixed)  # the next batch starts where the last one ended
        assert table(dsn, "clicks_count") == _oracle(fixed, payloads)[0]


def test_a_correction_killed_mid_commit_commits_exactly_once(dsn: str) -> None:
    make_log(dsn).append([click(i) for i in range(40)])
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=20))
        run_one(coord, "clicks", "r0", buggy)
        run_one(coord, "clicks", "r1", buggy)
        fix = coord.plan_correction("clicks", "fix", 1, 2)
        process_batch(coord, "clicks", fix.txid, fixed)
        before = table(dsn, "clicks_amount")
        for point in ("commit.after_apply", "commit.before_commit"):
            child = _commit_in_child(dsn, fix.txid, f"{point}=exit")
            assert child.returncode != 0 and table(dsn, "clicks_amount") == before
        coord.recover("clicks")
        assert coord.commit("clicks", fix.txid).committed
        assert not coord.commit("clicks", fix.txid).committed  # a replay is a no-op
        payloads = [p for _e, p in [click(i) for i in range(40)]]
        assert table(dsn, "clicks_amount") == _oracle(fixed, payloads)[1]
        _history_adds_up(coord, dsn)


def test_records_the_bug_quarantined_are_counted_once_by_the_fix(dsn: str) -> None:
    events = [click(i) for i in range(30)] + [(f"bad-{i}", json.dumps({"user": "u9"})) for i in range(5)]
    make_log(dsn).append(events)
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=50))
        run_one(coord, "clicks", "r0", buggy)  # the records without an amount fail: quarantined
        assert query(dsn, "SELECT count(*) FROM airflow_txn.quarantine WHERE committed") == [(5,)]
        fix = _correct(coord, "fix", 1, 1)
        assert query(dsn, "SELECT count(*) FROM airflow_txn.quarantine WHERE corrected_by = %s", (fix,)) == [(5,)]
        assert table(dsn, "clicks_count")["u9"] == 5
        second = _correct(coord, "fix-again", 1, 1)  # corrects the range again: counts nothing twice
        assert table(dsn, "clicks_count")["u9"] == 5
        assert coord.changes("clicks", second)["clicks_count"] == []
        # A later fix that quarantines what the first counted subtracts it and keeps it as its own.
        strict = _correct(coord, "strict", 1, 1, lambda r: fixed(r) if "amount" in r else 1 / 0)
        assert "u9" not in {k for k, v in table(dsn, "clicks_count").items() if v}
        assert query(dsn, "SELECT count(*) FROM airflow_txn.quarantine WHERE txid = %s AND committed",
                     (strict,)) == [(5,)]


def test_what_a_correction_must_not_do_is_refused_naming_why(dsn: str) -> None:
    log = make_log(dsn)
    log.append([click(i) for i in range(60)])
    mins = TopologySpec("lows", PostgresLogSource("clicks"), [StateSpec("lows", {"user_id": "text"}, combiner="min")])
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=20))
        coord.register(mins)
        for n in range(3):
            run_one(coord, "clicks", f"r{n}", buggy)
        with pytest.raises(ConfigError, match=r"committed txids 1..3: .* got 2..4"):
            coord.plan_correction("clicks", "x", 2, 4)
        with pytest.raises(ConfigError, match="only sum and count states can be corrected"):
            coord.plan_correction("lows", "x", 1, 1)
        _correct(coord, "fix-2-3", 2, 3)
        with pytest.raises(ConfigError, match=r"txid 4 corrects txids 2..3, which overlaps 1..2"):
            coord.plan_correction("clicks", "x", 1, 2)
        _truncate_all(dsn, log)  # retention removes what the txids read
        with pytest.raises(ConfigError, match=r"txids 1..1 cannot be read again \(.*retention"):
            coord.plan_correction("clicks", "x", 1, 1)
        coord.compact_history("clicks", 2)
        with pytest.raises(ConfigError, match="delta history starts after txid 2"):
            coord.plan_correction("clicks", "x", 1, 4)


def test_a_correction_whose_records_went_after_it_was_planned_fails_naming_them(dsn: str) -> None:
    log = make_log(dsn)
    log.append([click(i) for i in range(20)])
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=20, opaque=True))
        run_one(coord, "clicks", "r0", buggy)
        fix = coord.plan_correction("clicks", "fix", 1, 1)
        _truncate_all(dsn, log)
        with pytest.raises(BatchUnavailable, match=r"corrects txids .*can no longer be read"):
            process_batch(coord, "clicks", fix.txid, fixed)
        assert coord.transaction("clicks", fix.txid).corrects == {"txids": [1, 1]}  # never re-planned


def test_a_job_that_is_not_deterministic_is_caught_and_its_correction_withdrawn(dsn: str) -> None:
    """Re-processed under the code it was committed with, a txid must give the same deltas: a
    difference is refused at the commit, naming the keys; the correction is then withdrawn."""
    make_log(dsn).append([click(i) for i in range(40)])
    flips = iter(range(1, 10_000))

    def flaky(rec: dict[str, Any]) -> Rows:  # counts u1 differently every time it runs
        return fixed(rec) if rec["user"] != "u1" else [("clicks_count", ("u1",), next(flips)),
                                                        ("clicks_amount", ("u1",), 0)]

    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=40))
        run_one(coord, "clicks", "r0", flaky)
        before = table(dsn, "clicks_count")
        fix = coord.plan_correction("clicks", "check", 1, 1)
        process_batch(coord, "clicks", fix.txid, flaky)
        with pytest.raises(NonDeterministic, match=r"state clicks_count: keys \['u1'\].*withdraw"):
            coord.commit("clicks", fix.txid)
        assert table(dsn, "clicks_count") == before
        withdrawn = coord.withdraw_correction("clicks", fix.txid)
        assert withdrawn.empty and withdrawn.corrects["withdrawn"]
        assert coord.commit("clicks", fix.txid).committed and table(dsn, "clicks_count") == before
        assert coord.changes("clicks", fix.txid)["clicks_count"] == []
        with pytest.raises(ConfigError, match="is committed"):
            coord.withdraw_correction("clicks", fix.txid)
        batch = coord.plan("clicks", "r1")
        with pytest.raises(ConfigError, match="records are never skipped"):
            coord.withdraw_correction("clicks", batch.txid)


def test_a_landing_directory_correction_reads_every_planned_file_again_once(dsn: str, tmp_path: Any) -> None:
    """The merged batch of a landing directory is its txids' files, each as planned: a correction
    counts each once more under the fix, none twice, none skipped."""
    spec = TopologySpec("files", LandingDirectory(str(tmp_path), max_files=2, settle_seconds=0),
                        [StateSpec("file_sums", {"user_id": "text"}, combiner="sum")])
    for n in range(6):
        write_json_lines(str(tmp_path), f"f{n}.json", [{"user": f"u{i % 3}", "amount": i} for i in range(10)])

    def doubled(rec: dict[str, Any]) -> Rows:
        return [("file_sums", (rec["user"],), 2 * int(rec["amount"]))]

    def right(rec: dict[str, Any]) -> Rows:
        return [("file_sums", (rec["user"],), int(rec["amount"]))]

    with Coordinator(dsn) as coord:
        coord.register(spec)
        for run in ("a", "b", "c"):
            t = coord.plan("files", run)
            process_batch(coord, "files", t.txid, doubled)
            coord.commit("files", t.txid)
        fix = coord.plan_correction("files", "fix", 1, 3)
        assert len(fix.batch["files"]) == 6  # every file of the three txids, once
        process_batch(coord, "files", fix.txid, right)
        coord.commit("files", fix.txid)
        per_file = {f"u{u}": sum(i for i in range(10) if i % 3 == u) for u in range(3)}
        assert table(dsn, "file_sums") == {k: 6 * v for k, v in per_file.items()}
