"""core/recompute.py with the pure-Python processor on a real Postgres: the audit, the rebuild and a
correction's preview the Spark job runs (tests/spark/), from the same engine with plain Python's
fold. An audit is clean on honest states and names a key changed by hand, quarantined records
counted alike; a rebuild repairs it and keeps what a replay of an edited record counted; a preview
names what a fix would change, and nothing under the code that committed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import audit, preview, process_batch, rebuild
from tests.helpers import counting_topology, make_log, query, run_one, table
from tests.integration.test_replays import lenient, strict

pytestmark = pytest.mark.integration


def _committed(dsn: str) -> Coordinator:
    """30 good clicks of users u0..u2, four amounts written "N EUR" (quarantined by ``strict``) and a
    record that is not JSON, committed by ``strict`` as three txids."""
    good = [(f"ev-{i}", json.dumps({"user": f"u{i % 3}", "amount": i % 5})) for i in range(30)]
    euros = [(f"eur{i}", json.dumps({"user": "eu", "amount": f"{i} EUR"})) for i in range(1, 5)]
    make_log(dsn).append(good + euros + [("broken", '{"user": "x", "amount": ')])
    coord = Coordinator(dsn)
    coord.register(counting_topology(max_batch_size=12, max_quarantined=None))
    assert [run_one(coord, "clicks", f"r{n}", strict) for n in range(3)] == [1, 2, 3]
    assert coord.status("clicks").quarantined == 5
    return coord


def test_an_audit_in_plain_python_is_clean_on_honest_states_and_names_a_key_changed_by_hand(dsn: str) -> None:
    coord = _committed(dsn)
    found = audit(coord, "clicks", strict)
    assert (found["auditable"], found["differences"]) == (True, 0), found
    assert found["quarantined_recomputed"] == found["quarantined_committed"] == 5
    query(dsn, "UPDATE clicks_amount SET value = value + 7 WHERE user_id = 'u1'")
    found = audit(coord, "clicks", strict)
    assert found["differences"] == 1 and found["states"]["clicks_amount"]["differences"] == 1, found
    [sample] = found["samples"]
    assert sample.startswith("clicks_amount[u1]: stored ") and "recomputed" in sample
    lenient_audit = audit(coord, "clicks", lenient)  # other code counts the euros: differences, named
    assert lenient_audit["differences"] > 1 and "quarantine: 5 committed, 1 recomputed" in lenient_audit["samples"]
    coord.close()


def test_a_rebuild_in_plain_python_repairs_a_state_and_keeps_what_an_edited_replay_counted(dsn: str) -> None:
    coord = _committed(dsn)
    [(broken,)] = query(dsn, "SELECT id FROM airflow_txn.quarantine WHERE record LIKE '%\"x\"%'")
    coord.edit_quarantined("clicks", broken, '{"user": "x", "amount": 3}')  # fixed by hand
    txn = coord.plan_replay("clicks", "replay", {"ids": [broken]})
    process_batch(coord, "clicks", txn.txid, strict)
    assert coord.commit("clicks", txn.txid).committed and table(dsn, "clicks_amount")["x"] == 3
    want = {"count": table(dsn, "clicks_count"), "amount": table(dsn, "clicks_amount")}
    query(dsn, "UPDATE clicks_count SET value = 99 WHERE user_id = 'u0'")
    query(dsn, "DELETE FROM clicks_amount WHERE user_id = 'x'")
    rebuilt = rebuild(coord, "clicks", strict)
    assert rebuilt["rebuilt_at_txid"] == 4, rebuilt
    assert {"count": table(dsn, "clicks_count"), "amount": table(dsn, "clicks_amount")} == want
    assert audit(coord, "clicks", strict)["differences"] == 0
    coord.close()


def test_a_preview_in_plain_python_names_what_a_fix_changes_and_nothing_under_the_same_code(dsn: str) -> None:
    coord = _committed(dsn)
    same = preview(coord, "clicks", strict, 1, 3)
    assert (same["changed"], same["same_code"], same["nondeterministic"]) == (0, True, False), same
    fixed = preview(coord, "clicks", lenient, 1, 3)
    assert fixed["states"]["clicks_amount"]["changed"] == fixed["states"]["clicks_count"]["changed"] == 1, fixed
    assert (fixed["same_code"], fixed["nondeterministic"]) == (False, False)
    assert _changed(fixed, "clicks_amount") == [("eu", 1 + 2 + 3 + 4)]
    assert _changed(fixed, "clicks_count") == [("eu", 4)]
    assert not query(dsn, "SELECT 1 FROM airflow_txn.commits WHERE txid > 3")  # nothing committed
    coord.close()


def _changed(found: dict[str, Any], state: str) -> list[tuple[str, Any]]:
    """(key, new minus old) of a preview's samples of ``state`` ([key, old, new] each)."""
    return [(key, (new or 0) - (old or 0)) for key, old, new in found["states"][state]["samples"]]
