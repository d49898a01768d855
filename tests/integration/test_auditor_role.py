"""An auditor role for the shadow audit (``airflow-txn grant --auditor-role``): it alone writes the
verdicts, moves the verified-through mark and stages what a round recomputes, so the role that
commits cannot also say that what it committed was checked.

Tried as the run-time role would: recording a verdict, moving the mark, staging a round's
recomputation of its own, writing a correction's preview -- each refused; the auditor's round
verifies the honest commits and fails the one whose state and history it rewrote by hand, and the
run-time role can neither clear that failure nor step the mark over it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg2
import pytest

from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.processing import process_batch, verify
from airflow_transactional.sources import EventLog
from tests.helpers import click, query, table
from tests.integration.test_privileges import Roles, _feed, roles  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def auditor(roles: Roles) -> Iterator[str]:  # noqa: F811 (the fixture imported above)
    """A fourth role, and the owner's grant again, naming it the auditor."""
    name = f"auditor_{uuid.uuid4().hex[:6]}"
    roles.admin(f"CREATE ROLE {name} LOGIN PASSWORD '{roles.password}'")
    roles.names["auditor"] = name
    try:
        assert cli(["--dsn", roles.dsn_of("owner"), "grant", "--runtime-role", roles.names["runtime"],
                    "--producer-role", roles.names["producer"], "--log", "clicks", "--log", "feed",
                    "--auditor-role", name]) == 0
        yield name
    finally:
        roles.admin(f"DROP OWNED BY {name}; DROP ROLE {name}")
        del roles.names["auditor"]


def _commit_one(runtime: Coordinator, run_id: str) -> int:
    txn = runtime.plan("clicks", run_id)
    process_batch(runtime, "clicks", txn.txid, _feed)
    assert runtime.commit("clicks", txn.txid).committed
    return txn.txid


def test_only_the_auditor_writes_the_verdicts_the_mark_and_a_rounds_recomputation(
        roles: Roles, auditor: str) -> None:  # noqa: F811
    producer = EventLog(roles.dsn_of("producer"), "clicks")
    producer.append([click(i) for i in range(30)])
    runtime = Coordinator(roles.dsn_of("runtime"))
    assert _commit_one(runtime, "r1") == 1
    num = query(roles.dsn_of("owner"), "SELECT num FROM airflow_txn.topologies WHERE topology_id = 'clicks'")[0][0]
    for forged in ("INSERT INTO airflow_txn.verifications (topology_id, txid, status, detail) "
                   "VALUES ('clicks', 1, 'verified', '{}')",
                   "UPDATE airflow_txn.topologies SET verified_through = 1",
                   f"INSERT INTO airflow_txn.vfy_{num}_clicks_count VALUES (1, -1, 'u1', 1)",
                   "INSERT INTO airflow_txn.correction_previews (topology_id, first_txid, last_txid, result) "
                   "VALUES ('clicks', 1, 1, '{\"states\": {}}')"):
        roles.refused("runtime", forged)
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        verify(runtime, "clicks", _feed)  # a round of its own: refused before it records anything

    audit = Coordinator(roles.dsn_of("auditor"))
    checked = verify(audit, "clicks", _feed)
    assert [c["status"] for c in checked["checked"]] == ["verified"] and checked["verified_through"] == 1
    for commit_like in ("UPDATE airflow_txn.topologies SET committed_txid = 5",
                        "INSERT INTO airflow_txn.commits (topology_id, txid, attempt) VALUES ('clicks', 9, 1)",
                        "UPDATE clicks_count SET value = value + 1",
                        f"INSERT INTO airflow_txn.stg_{num}_clicks_count VALUES (9, 1, 'u1', 1)",
                        "DELETE FROM airflow_txn.log_events"):
        roles.refused("auditor", commit_like)  # and it commits nothing, appends nothing

    # Nor can it point a committed txid at other records (another txid's, counted twice) whose
    # recomputation would match what it committed: a committed plan stays as its commit left it.
    for moved in ("batch = '{}'", "start_offsets = '{}'", "end_offsets = '{}'", "planned_records = 0",
                  "read_digest = 'x'", "corrects = '{\"txids\": [1, 1]}'", "status = 'planned'",
                  "plan_version = plan_version + 1"):
        roles.refused("runtime", f"UPDATE airflow_txn.transactions SET {moved} WHERE txid = 1")
    query(roles.dsn_of("runtime"), "UPDATE airflow_txn.transactions SET failed_tries = failed_tries WHERE txid = 1")
    # The run-time role commits txid 2, then rewrites a state row and its delta history to agree.
    producer.append([click(i) for i in range(30, 45)])
    assert _commit_one(runtime, "r2") == 2
    stg = f"airflow_txn.stg_{num}_clicks_count"
    attempt, user, value = query(roles.dsn_of("runtime"), f"SELECT attempt, user_id, value FROM {stg} "
                                                          "WHERE txid = 2 AND attempt > 0 ORDER BY user_id LIMIT 1")[0]
    query(roles.dsn_of("runtime"), f"UPDATE clicks_count SET value = value + 100 WHERE user_id = '{user}'")
    query(roles.dsn_of("runtime"), f"DELETE FROM {stg} WHERE txid = 2 AND attempt = {attempt} AND user_id = '{user}'; "
                                   f"INSERT INTO {stg} VALUES (2, {attempt}, '{user}', {value + 100})")
    found = verify(audit, "clicks", _feed)
    assert found["verified_through"] == 1, found  # txid 2's check failed: the mark stays before it
    status = audit.verify_status("clicks")
    assert [f["txid"] for f in status["failures"]] == [2], status
    # Nor can the run-time role clear the failure or step the mark over it.
    roles.refused("runtime", "DELETE FROM airflow_txn.verifications")
    roles.refused("runtime", "UPDATE airflow_txn.verifications SET status = 'verified'")
    roles.refused("runtime", "UPDATE airflow_txn.topologies SET verified_through = 2")
    assert audit.verify_status("clicks")["verified_through"] == 1
    assert sum(table(roles.dsn_of("auditor"), "clicks_count").values()) == 45 + 100
    producer.close()
    runtime.close()
    audit.close()


def test_grant_refuses_an_auditor_that_is_or_shares_the_rights_of_a_role_it_audits(
        roles: Roles) -> None:  # noqa: F811
    member = f"inner_{uuid.uuid4().hex[:6]}"
    roles.admin(f"CREATE ROLE {member} LOGIN PASSWORD '{roles.password}' IN ROLE {roles.names['runtime']}")
    owner = Coordinator(roles.dsn_of("owner"))
    try:
        for name, kind in ((roles.names["runtime"], "run-time"), (member, "run-time"),
                           (roles.names["producer"], "producer")):
            with pytest.raises(ConfigError, match=f"--auditor-role '{name}' is the {kind} role, or a member of it"):
                owner.grant(runtime_role=roles.names["runtime"], producer_role=roles.names["producer"],
                            logs=["clicks"], auditor_role=name)
    finally:
        owner.close()
        roles.admin(f"DROP ROLE {member}")
