"""store/privileges.py: least privilege -- an owner registers, a run-time role plans, processes
and commits, a producer only appends; none can become another.

Tried as each role would: the run-time role rewriting a declaration the owner's commands then run
or drop, a producer moving its log's counters or writing in a topology's id space, the owner
granting a role that is the owner in all but name."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest
from psycopg2.extensions import make_dsn, parse_dsn

from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import registration
from airflow_transactional.exceptions import ConfigError, StagedOutputIncomplete
from airflow_transactional.processing import OutputEvent, process_batch, verify
from airflow_transactional.sources import EventLog, LandingDirectory, PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from dev.embedded import EmbeddedPostgres
from tests.helpers import click, make_log, query, table

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = """
from datetime import timedelta
from airflow_transactional import OutputSpec, PostgresLogSource, StateSpec, transactional_dag
dag = transactional_dag(
    "clicks", source=PostgresLogSource("clicks"),
    states=[StateSpec("clicks_count", {{"user_id": "text"}}, combiner="count"),
            StateSpec("clicks_amount", {{"user_id": "text"}}, combiner="sum")],
    outputs=[OutputSpec("feed", partitions=2)],
    application="{job}", schedule=timedelta(minutes=5), max_batch_size=50)
"""


@dataclass
class Roles:
    """Three login roles on one database: the schema's owner, the run-time role, a producer."""

    pg: EmbeddedPostgres
    dsn: str
    names: dict[str, str]
    password: str

    def dsn_of(self, role: str) -> str:
        return make_dsn(self.dsn, user=self.names[role], password=self.password)

    def admin(self, statement: str) -> None:
        conn = psycopg2.connect(self.pg.admin_dsn(parse_dsn(self.dsn)["dbname"]))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(statement)
        conn.close()

    def refused(self, role: str, statement: str) -> None:
        with pytest.raises((psycopg2.errors.InsufficientPrivilege, psycopg2.errors.CheckViolation)):
            query(self.dsn_of(role), statement)


@pytest.fixture
def roles(pg: EmbeddedPostgres, dsn: str, tmp_path: Path) -> Iterator[Roles]:
    """What a DBA does once -- the owner owns the provider's schema and may create state tables in
    public, and has no CREATE on the database -- then the owner registers the topology and grants."""
    suffix = uuid.uuid4().hex[:6]
    r = Roles(pg, dsn, {role: f"{role}_{suffix}" for role in ("owner", "runtime", "producer")}, f"pw-{suffix}")
    for name in r.names.values():
        r.admin(f"CREATE ROLE {name} LOGIN PASSWORD '{r.password}'")
    try:
        r.admin(f"CREATE SCHEMA airflow_txn AUTHORIZATION {r.names['owner']}")
        r.admin(f"GRANT USAGE, CREATE ON SCHEMA public TO {r.names['owner']}")
        owner = Coordinator(r.dsn_of("owner"))
        registration.migrate(owner.store)  # owning the schema is enough
        make_log(r.dsn_of("owner"), "clicks").close()
        make_log(r.dsn_of("owner"), "other").close()
        (tmp_path / "clicks_dag.py").write_text(DAG_FILE.format(job=REPO / "spark_jobs" / "words.py"))
        assert cli(["--dsn", r.dsn_of("owner"), "register", str(tmp_path / "clicks_dag.py")]) == 0
        assert cli(["--dsn", r.dsn_of("owner"), "grant", "--runtime-role", r.names["runtime"],
                    "--producer-role", r.names["producer"], "--log", "clicks", "--log", "feed"]) == 0
        owner.close()
        yield r
    finally:
        r.admin("DROP SCHEMA IF EXISTS airflow_txn CASCADE; DROP TABLE IF EXISTS clicks_count, clicks_amount, secrets")
        for name in r.names.values():
            r.admin(f"DROP OWNED BY {name}; DROP ROLE {name}")


def _feed(rec: dict[str, object]) -> list[object]:
    user = rec["user"]
    return [("clicks_count", (user,), 1), ("clicks_amount", (user,), rec["amount"]),
            OutputEvent("feed", {"user": user}, id=f"seen-{rec['amount']}-{user}")]


def test_three_roles_each_with_only_what_it_needs(roles: Roles) -> None:
    producer = EventLog(roles.dsn_of("producer"), "clicks")
    assert producer.append([click(i) for i in range(30)]).appended == 30
    with pytest.raises(ConfigError, match="log 'other' does not exist"):  # its row is invisible
        EventLog(roles.dsn_of("producer"), "other").append([click(99)])
    for forbidden in ("SELECT * FROM airflow_txn.topologies", "SELECT * FROM airflow_txn.log_events",
                      "DELETE FROM airflow_txn.log_events", "SELECT * FROM clicks_count"):
        roles.refused("producer", forbidden)

    runtime = Coordinator(roles.dsn_of("runtime"))
    owner = Coordinator(roles.dsn_of("owner"))
    spec = TopologySpec.from_config(owner.spec("clicks").to_config())
    runtime.register(spec)  # unchanged: nothing to write, no DDL
    txn = runtime.plan("clicks", "r1")
    process_batch(runtime, "clicks", txn.txid, _feed)
    assert runtime.commit("clicks", txn.txid).committed
    assert sum(table(roles.dsn_of("runtime"), "clicks_count").values()) == 30
    checked = verify(runtime, "clicks", _feed)  # the shadow audit runs as the run-time role
    assert [c["status"] for c in checked["checked"]] == ["verified"] and checked["verified_through"] == 1
    assert query(roles.dsn_of("owner"), "SELECT count(*) FROM airflow_txn.log_events WHERE log_name = 'feed'")[0][0] > 0
    roles.refused("runtime", "DROP TABLE clicks_count")
    new = TopologySpec("fresh", PostgresLogSource("clicks"), [StateSpec("fresh_count", {"k": "text"})])
    with pytest.raises(ConfigError, match="only the schema's owner may do"):
        runtime.register(new)
    changed = TopologySpec.from_config({**spec.to_config(), "max_batch_size": 99})  # a mutable setting, still
    with pytest.raises(ConfigError, match="only the schema's owner may do"):  # a declaration: the owner's
        runtime.register(changed)
    runtime.close()
    owner.close()


def test_the_runtime_role_cannot_change_a_declaration_or_a_logs_retention(roles: Roles) -> None:
    """Regression: with UPDATE on every table, the run-time role set a state's table to one of its
    choosing (the owner's reset dropped it) and the Spark application (the owner's audit ran it)."""
    for statement in (
            "UPDATE airflow_txn.topologies SET spec = jsonb_set(spec, '{job,application}', '\"/tmp/evil.py\"')",
            "UPDATE airflow_txn.topologies SET spec = jsonb_set(spec, '{states,0,table}', '\"secrets\"')",
            "INSERT INTO airflow_txn.topologies (topology_id, spec) VALUES ('evil', '{}')",
            "DELETE FROM airflow_txn.topologies",
            "UPDATE airflow_txn.log_partitions SET truncated_through = 10",
            "DELETE FROM airflow_txn.log_events",
            "UPDATE airflow_txn.log_events SET payload = '{}'",
            "UPDATE airflow_txn.commits SET records_read = 0",
            "DELETE FROM airflow_txn.commits",
            "UPDATE airflow_txn.landing_files SET path = '/etc/shadow'",
            "INSERT INTO airflow_txn.log_writers VALUES ('clicks', current_user)",
            "TRUNCATE airflow_txn.quarantine",
            "CREATE TABLE airflow_txn.mine (x int)",
            "UPDATE airflow_txn.log_partitions SET next_lsn = 0"):  # the guard: counters only grow
        roles.refused("runtime", statement)


def test_the_runtime_role_cannot_move_the_verified_mark_past_the_commits(roles: Roles) -> None:
    """Regression: ``UPDATE topologies SET verified_through = 999`` (3 committed) was accepted, and
    the owner's whole-history audit then started from txid 999."""
    roles.refused("runtime", "UPDATE airflow_txn.topologies SET verified_through = 999")
    roles.refused("runtime", "UPDATE airflow_txn.topologies SET verified_through = -1")


def test_a_producer_cannot_move_its_logs_counters_or_write_past_the_door(roles: Roles) -> None:
    """Regression: with UPDATE on log_partitions and INSERT on log_events, a producer set
    truncated_through (the consumer failed, an opaque one skipped real events), rewound next_lsn,
    and inserted events at any LSN."""
    producer = EventLog(roles.dsn_of("producer"), "clicks")
    assert producer.append([click(i) for i in range(5)], partition=0).appended == 5
    for statement in (
            "UPDATE airflow_txn.log_partitions SET truncated_through = 3 WHERE log_name = 'clicks'",
            "UPDATE airflow_txn.log_partitions SET next_lsn = 1 WHERE log_name = 'clicks'",
            "INSERT INTO airflow_txn.log_events (log_name, partition, lsn, event_id, payload) "
            "VALUES ('clicks', 0, 999, 'x', '{}')",
            "SELECT airflow_txn.append_events('other', '{0}', '{x}', '{\"{}\"}')",  # not its log
            "SELECT airflow_txn.append_outputs('clicks', 0, '{x}', '{\"{}\"}')",  # the commit's door
            "DELETE FROM airflow_txn.log_writers",
            "INSERT INTO airflow_txn.log_writers VALUES ('other', current_user)"):
        roles.refused("producer", statement)
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):  # retention is the owner's alone
        producer.truncate(0, 1)
    owner_log = EventLog(roles.dsn_of("owner"), "clicks")
    assert owner_log.truncate(0, 1, force=True) == 1
    owner_log.close()
    producer.close()


def test_the_runtime_role_cannot_move_a_logs_counter_and_the_owner_repairs_one(
        roles: Roles, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: with UPDATE on log_partitions (for the commit's output events) the run-time role
    set next_lsn to the largest bigint -- every later append failed 'bigint out of range' -- and
    the forward-only guard refused the owner's rewind. The commit appends through append_outputs
    now; the owner repairs a counter with ``airflow-txn repair-log``."""
    top = "UPDATE airflow_txn.log_partitions SET next_lsn = 9223372036854775807 WHERE log_name = 'clicks'"
    for statement in (top, "INSERT INTO airflow_txn.log_events (log_name, partition, lsn, event_id, payload) "
                           "VALUES ('feed', 0, 99, 'forged', '{}')"):
        roles.refused("runtime", statement)
    producer = EventLog(roles.dsn_of("producer"), "clicks")
    assert producer.append([click(i) for i in range(5)], partition=0).appended == 5
    query(roles.dsn_of("owner"), top + " AND partition = 0")  # as the hole did (the owner still may)
    with pytest.raises(psycopg2.errors.NumericValueOutOfRange):
        producer.append([click(9)], partition=0)
    with pytest.raises(psycopg2.errors.CheckViolation, match="repair-log"):  # a plain rewind: still refused
        query(roles.dsn_of("owner"), "UPDATE airflow_txn.log_partitions SET next_lsn = 6 WHERE log_name = 'clicks'")
    with pytest.raises(psycopg2.errors.CheckViolation):  # nor, repairing, onto an LSN the partition holds
        query(roles.dsn_of("owner"), "SELECT set_config('airflow_transactional.repair_log', 'on', true); UPDATE "
                                     "airflow_txn.log_partitions SET next_lsn = 5 WHERE log_name = 'clicks' "
                                     "AND partition = 0")
    assert cli(["--dsn", roles.dsn_of("runtime"), "repair-log", "clicks"]) == 1  # the owner's alone
    assert cli(["--dsn", roles.dsn_of("producer"), "repair-log", "clicks"]) == 1
    capsys.readouterr()
    assert cli(["--dsn", roles.dsn_of("owner"), "repair-log", "clicks", "--partition", "0"]) == 0
    assert "partition 0: next LSN 9223372036854775807 -> 6" in capsys.readouterr().out
    assert producer.append([click(9)], partition=0).appended == 1
    assert query(roles.dsn_of("owner"), "SELECT max(lsn) FROM airflow_txn.log_events WHERE log_name = 'clicks' "
                                        "AND partition = 0") == [(6,)]
    runtime = Coordinator(roles.dsn_of("runtime"))  # the commit still appends its output events
    txn = runtime.plan("clicks", "r1")
    process_batch(runtime, "clicks", txn.txid, _feed)
    assert runtime.commit("clicks", txn.txid).committed
    assert query(roles.dsn_of("owner"), "SELECT count(*) FROM airflow_txn.log_events WHERE log_name = 'feed'")[0][0] > 0
    runtime.close()
    producer.close()


def test_the_runtime_role_registers_and_follows_landing_files(roles: Roles, tmp_path: Path) -> None:
    """What a landing topology's plan writes, the run-time role may: a new file's row, and a touched
    file's row following it -- with what registration now records of its lines (plain)."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    owner = Coordinator(roles.dsn_of("owner"))
    owner.register(TopologySpec("landed", LandingDirectory(str(inbox), settle_seconds=0), [
        StateSpec("landed_count", {"user_id": "text"}, combiner="count")]))
    owner.close()
    assert cli(["--dsn", roles.dsn_of("owner"), "grant", "--runtime-role", roles.names["runtime"]]) == 0
    runtime = Coordinator(roles.dsn_of("runtime"))
    (inbox / "a.json").write_text('{"user": "ann"}\n')
    os.utime(inbox / "a.json", (time.time() - 60, time.time() - 60))
    for run in ("r1", "r2"):
        txn = runtime.plan("landed", run)
        process_batch(runtime, "landed", txn.txid, lambda r: [("landed_count", (r["user"],), 1)])
        assert runtime.commit("landed", txn.txid).committed
        os.utime(inbox / "a.json", (time.time() - 30, time.time() - 30))  # touched: the same bytes
        (inbox / "b.json").write_text('{"user": "bob"}\n')
    assert table(roles.dsn_of("runtime"), "landed_count") == {"ann": 1, "bob": 1}
    assert query(roles.dsn_of("owner"), "SELECT path LIKE '%a.json', plain FROM airflow_txn.landing_files "
                                        "ORDER BY seq") == [(True, True), (False, True)]
    runtime.close()
    query(roles.dsn_of("owner"), "DROP TABLE landed_count")


def test_a_producer_cannot_squat_a_topologys_output_ids(roles: Roles) -> None:
    """Regression: the deposit producer on the payments ledger appended an event with the commit's
    future id; the commit dropped the real event as a duplicate and reported success."""
    EventLog(roles.dsn_of("producer"), "clicks").append([click(i, user="ann", amount=i) for i in range(3)])
    feed = EventLog(roles.dsn_of("producer"), "feed")
    squat = feed.append([("clicks:seen-1-ann", json.dumps({"user": "mallory"})), ("deposit-1", "{}")])
    assert squat.appended == 1 and [r[0] for r in squat.rejected] == ["clicks:seen-1-ann"]
    assert "id space of a topology" in squat.rejected[0][1]
    runtime = Coordinator(roles.dsn_of("runtime"))
    txn = runtime.plan("clicks", "r1")
    process_batch(runtime, "clicks", txn.txid, _feed)
    assert runtime.commit("clicks", txn.txid).committed
    feed_events = dict(query(roles.dsn_of("owner"), "SELECT event_id, payload FROM airflow_txn.log_events "
                                                    "WHERE log_name = 'feed'"))
    assert json.loads(feed_events["clicks:seen-1-ann"]) == {"user": "ann"}
    runtime.close()
    feed.close()


def test_an_output_id_collision_with_another_payload_fails_the_commit_loudly(roles: Roles) -> None:
    """Whoever wrote it (the owner here, who may write anywhere), an event already in the log under
    the id a commit would append with another payload fails the commit -- never a silent drop."""
    EventLog(roles.dsn_of("producer"), "clicks").append([click(i, user="ann", amount=i) for i in range(3)])
    query(roles.dsn_of("owner"), "INSERT INTO airflow_txn.log_events (log_name, partition, lsn, event_id, payload) "
                                 "VALUES ('feed', 0, 1000, 'clicks:seen-2-ann', '{\"user\": \"mallory\"}')")
    runtime = Coordinator(roles.dsn_of("runtime"))
    txn = runtime.plan("clicks", "r1")
    process_batch(runtime, "clicks", txn.txid, _feed)
    with pytest.raises(StagedOutputIncomplete, match="'clicks:seen-2-ann' is already in log 'feed' with another "
                                                     "payload"):
        runtime.commit("clicks", txn.txid)
    assert runtime.status("clicks").committed_txid == 0
    runtime.close()


def test_the_owners_commands_never_run_or_drop_what_another_role_wrote(roles: Roles, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """audit and rebuild take the job from the DAG file the owner names and refuse a store whose
    declaration differs; reset drops only the tables the topology's registration made."""
    owner_dsn = roles.dsn_of("owner")
    dag_file = str(tmp_path / "clicks_dag.py")
    assert cli(["--dsn", owner_dsn, "audit", "clicks"]) == 1
    assert "name the DAG file that declares it" in capsys.readouterr().err
    # A declaration changed behind the owner's back (only a role with the owner's rights can now).
    query(owner_dsn, "CREATE TABLE secrets (user_id text PRIMARY KEY, value bigint, txid bigint NOT NULL)")
    query(owner_dsn, "INSERT INTO secrets VALUES ('root', 42, 1)")
    query(owner_dsn, "UPDATE airflow_txn.topologies SET spec = jsonb_set(jsonb_set(spec, '{job,application}', "
                     "'\"/tmp/evil.py\"'), '{states,0,table}', '\"secrets\"')")
    for command in ("audit", "rebuild"):
        assert cli(["--dsn", owner_dsn, command, "clicks", "--dag-file", dag_file]) == 1
        err = capsys.readouterr().err
        assert "differs from" in err and "job, states" in err and f"register {dag_file}" in err, err
    assert cli(["--dsn", owner_dsn, "reset", "clicks", "--yes"]) == 0
    out = capsys.readouterr().out
    assert 'kept "public"."secrets"' in out and '"public"."clicks_amount"' in out
    assert query(owner_dsn, "SELECT user_id, value FROM secrets") == [("root", 42)]


@pytest.mark.parametrize(("args", "fix"), [
    (["--runtime-role", "postgres"], "is a superuser"),
    (["--runtime-role", "nobody_here"], "no such role"),
    (["--runtime-role", "{owner}"], "is the schema's owner"),
    (["--runtime-role", "{runtime}", "--producer-role", "{producer}", "--log", "nosuchlog"], "no log 'nosuchlog'"),
    (["--runtime-role", "{runtime}", "--producer-role", "{producer}"], "needs the logs it may append to"),
    (["--runtime-role", "{runtime}", "--producer-role", "{runtime}", "--log", "clicks"], "must be two roles"),
])
def test_grant_refuses_a_role_that_would_be_the_owner_in_all_but_name(
        roles: Roles, args: list[str], fix: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(**roles.names) for a in args]
    assert cli(["--dsn", roles.dsn_of("owner"), "grant", *argv]) == 1
    assert fix in capsys.readouterr().err


def test_a_producer_can_neither_take_nor_stall_a_turn(roles: Roles, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: publishers, decisions and rebuilds took turns with advisory locks, which any role
    may take and whose keys follow from public names: a producer holding one stalled every publish
    (then failed it after 300 s) and a decision's processing, and made a rebuild look running. Turns
    are row locks on rows only the owner and the run-time role may lock."""
    import zlib

    from airflow_transactional.core import publish, rebuild
    from airflow_transactional.core.context import StateStore

    producer = psycopg2.connect(roles.dsn_of("producer"))
    producer.autocommit = True
    with producer.cursor() as cur:  # every key the advisory locks took, held by the producer
        cur.execute("SELECT pg_advisory_lock(hashtext('airflow_txn.clicks.feed'))")
        cur.execute("SELECT pg_advisory_lock(%s)",
                    (zlib.crc32(b"airflow_transactional:airflow_txn:rebuild:clicks") & 0x7FFFFFFF,))
        cur.execute("SELECT pg_advisory_lock(1954051684, hashtext('airflow_txn.clicks.feed'))")
    monkeypatch.setattr(publish, "LOCK_WAIT", 2.0)
    runtime = StateStore(roles.dsn_of("runtime"), schema="airflow_txn")
    turn = publish._take_turn(runtime, "airflow_txn.clicks.feed")  # not stalled
    owner = StateStore(roles.dsn_of("owner"), schema="airflow_txn")
    started = rebuild.begin(owner, "clicks")  # not "a rebuild running"
    assert rebuild.abort(owner, "clicks", started=started)
    for statement in ("SELECT name FROM airflow_txn.turns FOR UPDATE", "INSERT INTO airflow_txn.turns VALUES ('x')",
                      "SELECT name FROM airflow_txn.turns FOR UPDATE SKIP LOCKED"):
        roles.refused("producer", statement)
    # The turn is the runtime role's while it holds it: a second publisher waits, then gives up.
    with pytest.raises(Exception, match="held its lock for 2 s"):
        publish._take_turn(StateStore(roles.dsn_of("runtime"), schema="airflow_txn"), "airflow_txn.clicks.feed")
    turn.release()
    publish._take_turn(runtime, "airflow_txn.clicks.feed").release()
    runtime.close()
    owner.close()
    producer.close()


def test_a_producer_sees_only_its_own_rows_of_the_log_writers(roles: Roles) -> None:
    """Regression: a producer read log_writers whole -- every producer role and the logs each may write."""
    roles.admin("INSERT INTO airflow_txn.log_writers (log_name, role_name) VALUES ('other', 'someone_else')")
    seen = query(roles.dsn_of("producer"), "SELECT log_name, role_name FROM airflow_txn.log_writers ORDER BY 1")
    assert seen == [("clicks", roles.names["producer"]), ("feed", roles.names["producer"])]
    # Its own appends still go through, and the run-time role still sees every row.
    producer = EventLog(roles.dsn_of("producer"), "clicks")
    assert producer.append([click(1)], partition=0).appended == 1
    producer.close()
    assert len(query(roles.dsn_of("runtime"), "SELECT * FROM airflow_txn.log_writers")) == 3


def test_a_decisions_headroom_is_readable_only_when_grant_names_it(roles: Roles,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: a headroom naming any table of the database (``public.owner_secret``) became
    SELECT for the run-time role at ``grant``, without a word: a declaration opened the table."""
    from airflow_transactional import DecisionSpec

    owner = roles.dsn_of("owner")
    query(owner, "CREATE TABLE owner_secret (account text PRIMARY KEY, value bigint)")
    query(owner, "INSERT INTO owner_secret VALUES ('root', 42)")
    with Coordinator(owner) as coord:
        coord.register(TopologySpec("payer", PostgresLogSource("other"), [
            StateSpec("debits", {"account": "text"}, table="payer_debits")],
            decisions=[DecisionSpec("pay", state="debits", headroom="public.owner_secret")]))
    grant = ["--dsn", owner, "grant", "--runtime-role", roles.names["runtime"]]
    assert cli(grant) == 1
    assert "read public.owner_secret (a decision's headroom)" in capsys.readouterr().err
    roles.refused("runtime", "SELECT * FROM public.owner_secret")
    assert cli([*grant, "--readable", "public.owner_secret"]) == 0
    assert query(roles.dsn_of("runtime"), "SELECT value FROM public.owner_secret") == [(42,)]

