"""core/replays.py on a real Postgres: quarantined records replayed as a txid of their own -- as they
are after a transform fix, edited by hand, or fixed by a Python function -- each counted once,
never replayed twice, quarantined anew by the replay when it fails again; a replay killed
mid-commit commits once; and a later correction of their txids counts none of them twice."""

from __future__ import annotations

import collections
import json
import sys
import types
from typing import Any

import pytest

from airflow_transactional import cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.processing import process_batch
from tests.helpers import click, counting_topology, make_log, query, run_one, table
from tests.integration.test_crash_points import _commit_in_child

pytestmark = pytest.mark.integration

Rows = list[tuple[str, tuple[Any, ...], Any]]


def strict(rec: dict[str, Any]) -> Rows:
    """The deployed transform: an amount must be a number."""
    return [("clicks_count", (rec["user"],), 1), ("clicks_amount", (rec["user"],), int(rec["amount"]))]


def lenient(rec: dict[str, Any]) -> Rows:
    """The fix: an amount written as "12 EUR" is 12."""
    amount = str(rec["amount"]).split()[0]
    return [("clicks_count", (rec["user"],), 1), ("clicks_amount", (rec["user"],), int(amount))]


def _events() -> list[tuple[str, str]]:
    good = [click(i, user=f"u{i % 3}", amount=1) for i in range(30)]
    euros = [(f"eur{i}", json.dumps({"user": "eu", "amount": f"{i} EUR"})) for i in range(1, 5)]
    broken = [("broken", '{"user": "x", "amount": ')]  # not JSON: no transform fixes it
    return good + euros + broken


def _replay(coord: Coordinator, run_key: str, selection: dict[str, Any], fn: Any = lenient) -> int:
    txn = coord.plan_replay("clicks", run_key, selection)
    assert txn.start_offsets == txn.end_offsets  # a replay reads no new records
    process_batch(coord, "clicks", txn.txid, fn)
    assert coord.commit("clicks", txn.txid).committed
    return txn.txid


def _ids(dsn: str, where: str) -> list[int]:
    return [i for (i,) in query(dsn, f"SELECT id FROM airflow_txn.quarantine WHERE {where} ORDER BY id")]


def test_a_fixed_transform_replays_what_it_quarantined_once(dsn: str) -> None:
    make_log(dsn).append(_events())
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=50))
        run_one(coord, "clicks", "r0", strict)
        euros = _ids(dsn, "record LIKE '%EUR%'")
        assert len(euros) == 4 and coord.status("clicks").quarantined == 5
        [(reason,)] = query(dsn, "SELECT reason FROM airflow_txn.quarantine WHERE id = %s", (euros[0],))
        one = _replay(coord, "replay-one", {"txids": "1..1", "reason": reason})  # that reason: "1 EUR" alone
        assert table(dsn, "clicks_amount")["eu"] == 1 and _ids(dsn, f"corrected_by = {one}") == euros[:1]
        replay = _replay(coord, "replay-eur", {"ids": euros[1:]})
        assert table(dsn, "clicks_amount")["eu"] == 1 + 2 + 3 + 4
        assert _ids(dsn, f"corrected_by = {replay}") == euros[1:]
        assert coord.status("clicks").quarantined == 1  # the broken one waits
        [*_, last] = coord.commits("clicks")
        assert last["corrects"] == {"replay": euros[1:], "of_txids": [1]}
        assert dict(coord.changes("clicks", replay)["clicks_count"]) == {"eu": 3}
        with pytest.raises(ConfigError, match=f"{euros[1]}: already counted by txid {replay}"):
            coord.plan_replay("clicks", "again", {"ids": euros})
        with pytest.raises(ConfigError, match="no quarantined record to replay matches"):
            coord.plan_replay("clicks", "again", {"txids": "1..1", "reason": "no such reason"})


def test_a_record_fixed_by_hand_or_by_a_function_is_replayed_as_fixed(dsn: str, capsys: Any) -> None:
    make_log(dsn).append(_events())
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=50))
        run_one(coord, "clicks", "r0", strict)
        [broken] = _ids(dsn, "event_id = 'broken'")
        assert cli.main(["--dsn", dsn, "quarantine", "clicks", "--edit", str(broken),
                         "--record", '{"user": "x", "amount": 7}']) == 0
        fixer = types.ModuleType("txn_test_fixer")
        fixer.strip_eur = lambda text: text.replace(" EUR", "") if "EUR" in text else None  # type: ignore[attr-defined]
        sys.modules["txn_test_fixer"] = fixer
        try:
            assert cli.main(["--dsn", dsn, "quarantine", "clicks", "--fixer", "txn_test_fixer:strip_eur"]) == 0
        finally:
            del sys.modules["txn_test_fixer"]
        assert "4 of 5 records edited" in capsys.readouterr().out
        replay = _replay(coord, "replay-all", {"txids": "1..1"}, strict)  # the deployed code, the fixed records
        assert table(dsn, "clicks_amount")["x"] == 7 and table(dsn, "clicks_amount")["eu"] == 10
        assert len(_ids(dsn, f"corrected_by = {replay}")) == 5 and coord.status("clicks").quarantined == 0
        assert cli.main(["--dsn", dsn, "quarantine", "clicks", "--json"]) == 0
        listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert {r["corrected_by"] for r in listed} == {replay}
        with pytest.raises(ConfigError, match=r"no quarantined record .* left to replay"):
            coord.edit_quarantined("clicks", broken, "{}")


def test_a_record_that_fails_again_is_quarantined_anew_by_the_replay(dsn: str) -> None:
    make_log(dsn).append(_events())
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=50))
        run_one(coord, "clicks", "r0", strict)
        first = _replay(coord, "replay-1", {"txids": "1..1"})  # the fix counts the euros; "broken" fails again
        [again] = _ids(dsn, f"txid = {first}")
        assert query(dsn, "SELECT event_id, reason LIKE '%%JSON%%' OR reason LIKE '%%json%%' FROM "
                          "airflow_txn.quarantine WHERE id = %s", (again,)) == [("broken", True)]
        assert coord.status("clicks").quarantined == 1  # the original is replayed, the new one waits
        coord.edit_quarantined("clicks", again, '{"user": "x", "amount": 1}')
        second = _replay(coord, "replay-2", {"ids": [again]})
        assert _ids(dsn, f"corrected_by = {second}") == [again]
        assert table(dsn, "clicks_count") == dict(collections.Counter(
            [f"u{i % 3}" for i in range(30)] + ["eu"] * 4 + ["x"]))


def test_a_replay_killed_mid_commit_commits_once_and_a_later_correction_counts_nothing_twice(dsn: str) -> None:
    make_log(dsn).append(_events())
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=50))
        run_one(coord, "clicks", "r0", strict)
        txn = coord.plan_replay("clicks", "replay", {"txids": "1..1"})
        assert coord.plan_replay("clicks", "replay", {"ids": [1]}) == txn  # a retried plan task gets the same
        process_batch(coord, "clicks", txn.txid, lenient)
        before = table(dsn, "clicks_amount")
        child = _commit_in_child(dsn, txn.txid, "commit.before_commit=exit")
        assert child.returncode != 0 and table(dsn, "clicks_amount") == before
        assert coord.commit("clicks", txn.txid).committed and not coord.commit("clicks", txn.txid).committed
        counted = table(dsn, "clicks_amount")
        assert counted["eu"] == 10
        # A correction of txid 1 under the fix reads the euros from the source again; the replay
        # (of txid 1's records) lies inside its range, so its deltas are among what it replaces.
        fix = coord.plan_correction("clicks", "fix", 1, 1)
        process_batch(coord, "clicks", fix.txid, lenient)
        coord.commit("clicks", fix.txid)
        assert table(dsn, "clicks_amount") == counted
        with pytest.raises(ConfigError, match=r"txids 2\.\.2 are corrections and replays"):
            coord.plan_correction("clicks", "x", 2, 2)


def test_a_withdrawn_replay_frees_its_records(dsn: str) -> None:
    make_log(dsn).append(_events())
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=50))
        run_one(coord, "clicks", "r0", strict)
        taken = coord.plan_replay("clicks", "replay", {"txids": "1..1"})
        with pytest.raises(ConfigError, match="already replayed by txid 2"):
            coord.plan_replay("clicks", "other", {"ids": list(taken.batch.replay)})  # type: ignore[attr-defined]
        coord.withdraw_correction("clicks", taken.txid)
        assert coord.commit("clicks", taken.txid).committed
        assert _replay(coord, "again", {"ids": list(taken.batch.replay)}) == 3  # type: ignore[attr-defined]
        assert table(dsn, "clicks_amount")["eu"] == 10


def test_a_replay_of_an_id_past_what_the_store_holds_is_refused_naming_the_form(coordinator: Coordinator,
                                                                                 dsn: str) -> None:
    """Regression: ``{"ids": [2**70]}`` reached Postgres and came back as NumericValueOutOfRange."""
    make_log(dsn)
    coordinator.register(counting_topology())
    for ids in ([2**70], [0], [-1]):
        with pytest.raises(ConfigError, match=r"a replay names quarantined records as \{'ids': \[ids\]\}"):
            coordinator.plan_replay("clicks", "r-huge", {"ids": ids})


def _raises_keyboard_interrupt(text: str) -> str:
    raise KeyboardInterrupt


@pytest.mark.parametrize(("argv", "refusal"), [
    (["--edit", "{broken}", "--record-file", "{tmp}/nowhere.json"], r"--record-file .*nowhere\.json: No such file"),
    (["--edit", "{broken}", "--record-file", "{tmp}/nul.json"], r"was not edited: the record holds a NUL byte"),
    (["--edit", "{broken}", "--record-file", "{tmp}/latin1.json"], r"is not UTF-8 text \(byte 13\)"),
    (["--edit", "{broken}", "--record-file", "{tmp}/large.json"], r"more than the 1,048,576 bytes allowed"),
    (["--edit", "{broken}", "--record", '{{"user": "\\ud800"}}'], r"escaped lone surrogate"),
    (["--edit", "{broken}", "--record", "\ud800"], r"lone surrogate \(U\+D800"),
    (["--fixer", "txn_no_such_module:fn"], r"no module 'txn_no_such_module' can be imported here"),
    (["--fixer", "json:no_such_function"], r"module 'json' has no 'no_such_function'"),
    (["--fixer", "tests.integration.test_replays:_raises_keyboard_interrupt"],
     r"failed on record \d+ \(KeyboardInterrupt: \); 0 record\(s\) edited before it are kept"),
])
def test_a_bad_edit_or_fixer_is_refused_in_one_line_and_edits_nothing(
        dsn: str, tmp_path: Any, capsys: Any, argv: list[str], refusal: str) -> None:
    """Regression: each of these was a traceback (a missing or non-UTF-8 file, a NUL, an unknown
    fixer, a fixer interrupted) or an edit accepted now and quarantined again by its replay (2 MiB,
    a lone surrogate)."""
    (tmp_path / "nul.json").write_text('{"user": "x\x00", "amount": 1}')
    (tmp_path / "latin1.json").write_bytes('{"user": "caf\xe9", "amount": 1}'.encode("latin-1"))
    (tmp_path / "large.json").write_text('{"user": "' + "x" * (2 << 20) + '", "amount": 1}')
    make_log(dsn).append(_events())
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=50))
        run_one(coord, "clicks", "r0", strict)
    [broken] = _ids(dsn, "event_id = 'broken'")
    given = [a.format(broken=broken, tmp=tmp_path) for a in argv]
    assert cli.main(["--dsn", dsn, "quarantine", "clicks", *given]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert __import__("re").search(refusal, err), err
    assert query(dsn, "SELECT count(*) FROM airflow_txn.quarantine WHERE edited_record IS NOT NULL") == [(0,)]


def test_changes_of_a_state_the_topology_does_not_declare_is_an_error(dsn: str, capsys: Any) -> None:
    """Regression: ``changes clicks 1 --state nosuch`` printed nothing and exited 0."""
    make_log(dsn).append(_events())
    with Coordinator(dsn) as coord:
        coord.register(counting_topology(max_batch_size=50))
        run_one(coord, "clicks", "r0", strict)
    assert cli.main(["--dsn", dsn, "changes", "clicks", "1", "--state", "nosuch"]) == 1
    assert "nosuch" in capsys.readouterr().err
    assert cli.main(["--dsn", dsn, "changes", "clicks", "1", "--state", "clicks_count"]) == 0
    assert "# state clicks_count: 3 keys changed by txid 1" in capsys.readouterr().out
