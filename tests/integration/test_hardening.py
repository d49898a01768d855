"""Production hardening on the real embedded PostgreSQL: privilege, secrets, silent data loss.

Each test feeds the provider what a hostile local user or a careless operator would, and checks
that it is refused with a message naming the fix, and that nothing is lost.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest

from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError, DeclarationChanged, TopologyOfAnotherDag
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from dev.embedded import EmbeddedPostgres
from tests.helpers import click, counting_topology, make_log, query, run_one, table

pytestmark = pytest.mark.integration


# -- the embedded server ---------------------------------------------------------------------

def test_the_embedded_superuser_needs_a_password_over_a_private_socket(pg: EmbeddedPostgres) -> None:
    st = os.stat(pg.socket_dir)
    assert stat.S_IMODE(st.st_mode) == 0o700
    with pytest.raises(psycopg2.OperationalError, match="password"):
        psycopg2.connect(f"host={pg.socket_dir} port={pg.port} dbname=postgres user=postgres").close()
    psycopg2.connect(pg.admin_dsn()).close()
    meta = Path(pg.base_dir) / "embedded.json"
    assert stat.S_IMODE(os.stat(meta).st_mode) == 0o600


def test_another_local_user_cannot_reach_the_socket(pg: EmbeddedPostgres) -> None:
    python = "/usr/bin/python3"  # the virtualenv may sit where another user cannot enter
    if os.geteuid() != 0 or not os.access(python, os.X_OK):
        pytest.skip("needs root and a system python to run a client as another user")
    probe = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "try:\n s.connect(sys.argv[1]); print('CONNECTED')\n"
             "except OSError as e: print('REFUSED', e)\n")
    res = subprocess.run([python, "-c", probe, str(pg.socket_dir / f".s.PGSQL.{pg.port}")], capture_output=True,
                         text=True, user="nobody", check=False, cwd="/")
    assert "REFUSED" in res.stdout and "Permission denied" in res.stdout, res.stdout + res.stderr


def test_a_cluster_made_with_trust_auth_is_upgraded_to_passwords_and_cleans_up(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "old").start()
    try:
        # What a cluster initialised by an older release looks like: trust for local connections
        # and no superuser password on record.
        (server.data_dir / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
        meta = json.loads((server.base_dir / "embedded.json").read_text())
        meta["superuser_password"] = None
        (server.base_dir / "embedded.json").write_text(json.dumps(meta))
        server.restart()
        server.stop()
        again = EmbeddedPostgres(tmp_path / "old").start()
        assert again.superuser_password
        with pytest.raises(psycopg2.OperationalError, match="password"):
            psycopg2.connect(f"host={again.socket_dir} port={again.port} dbname=postgres user=postgres").close()
        psycopg2.connect(again.dsn()).close()
        socket_dir = again.socket_dir
    finally:
        EmbeddedPostgres(tmp_path / "old").stop()
    assert not socket_dir.exists()  # nothing left in the temp directory


# -- a re-declared topology ------------------------------------------------------------------

def words(source: PostgresLogSource, *, keys: dict[str, str] | None = None, dag_id: str | None = None,
          batch: int = 50) -> TopologySpec:
    return TopologySpec("drift", source, [StateSpec("drift_count", keys or {"user_id": "text"}, combiner="count")],
                        max_batch_size=batch, extra={"dag_id": dag_id} if dag_id else {})


def count_fn(rec: dict[str, object]) -> list[tuple[str, tuple[object, ...], int]]:
    return [("drift_count", (rec["user"],), 1)]


def test_a_changed_source_is_refused_once_batches_were_planned_and_reset_starts_over(coordinator: Coordinator,
                                                                                       dsn: str) -> None:
    old_log, new_log = make_log(dsn, "old_log"), make_log(dsn, "new_log")
    old_log.append([click(i) for i in range(10)])
    new_log.append([click(i + 100) for i in range(7)])
    coordinator.register(words(PostgresLogSource("old_log")))
    run_one(coordinator, "drift", "r1", count_fn)
    with pytest.raises(DeclarationChanged, match=r"old_log.*new_log.*airflow-txn reset drift --yes"):
        coordinator.register(words(PostgresLogSource("new_log")))
    with pytest.raises(DeclarationChanged, match="keys"):
        coordinator.register(words(PostgresLogSource("old_log"), keys={"user_id": "bigint"}))
    coordinator.register(words(PostgresLogSource("old_log"), batch=500))  # a batch cap may change
    assert coordinator.status("drift").committed_txid == 1

    assert cli(["--dsn", dsn, "reset", "drift"]) == 1  # without --yes: refused
    assert cli(["--dsn", dsn, "reset", "drift", "--yes"]) == 0
    coordinator.register(words(PostgresLogSource("new_log")))
    run_one(coordinator, "drift", "r1", count_fn)
    assert sum(table(dsn, "drift_count").values()) == 7  # all of the new log, none of the old one
    assert coordinator.status("drift").lag == 0


def test_a_declaration_may_change_freely_before_anything_was_planned(coordinator: Coordinator, dsn: str) -> None:
    make_log(dsn, "a_log")
    make_log(dsn, "b_log")
    coordinator.register(words(PostgresLogSource("a_log")))
    coordinator.register(words(PostgresLogSource("b_log")))
    assert coordinator.spec("drift").source == PostgresLogSource("b_log")


def test_two_dags_cannot_run_one_topology(coordinator: Coordinator, dsn: str) -> None:
    make_log(dsn, "shared").append([click(1)])
    coordinator.register(words(PostgresLogSource("shared"), dag_id="drift"))
    # Refused from the first registration, planned or not: the second DAG's runs would claim the
    # first one's txids (their run ids, e.g. scheduled__2024-01-01, match).
    with pytest.raises(TopologyOfAnotherDag, match="run by DAG 'drift', and DAG 'drift_copy' declares it too"):
        coordinator.register(words(PostgresLogSource("shared"), dag_id="drift_copy"))
    run_one(coordinator, "drift", "scheduled__1", count_fn)
    with pytest.raises(TopologyOfAnotherDag, match="airflow-txn reset drift --yes"):
        coordinator.register(words(PostgresLogSource("shared"), dag_id="drift_copy"))
    coordinator.register(words(PostgresLogSource("shared"), dag_id="drift"))  # its own DAG: fine


# -- retention -------------------------------------------------------------------------------

def test_retention_never_passes_the_head_nor_what_readers_committed(coordinator: Coordinator, dsn: str) -> None:
    log = make_log(dsn, partitions=1)
    log.append([click(i) for i in range(3)])
    with pytest.raises(ConfigError, match="holds LSNs up to 3"):
        log.truncate(0, 10**6)
    spec = counting_topology(max_batch_size=2)
    coordinator.register(spec)
    run_one(coordinator, "clicks", "r1")  # commits LSN 1..2
    with pytest.raises(ConfigError, match=r"topology .clicks. has committed only through LSN 2.*force=True"):
        log.truncate(0, 3)
    assert log.truncate(0, 2) == 2
    assert coordinator.status("clicks").lag == 1
    assert log.truncate(0, 3, force=True) == 1  # explicit: the reader loses LSN 3
    with pytest.raises(ConfigError, match="non-negative integer"):
        log.truncate(0, -1)


# -- bad input to the producer API -----------------------------------------------------------

def test_a_record_postgres_cannot_store_is_refused_alone(dsn: str) -> None:
    log = make_log(dsn, partitions=1)
    res = log.append([("a", "{}"), ("b", "nul\x00byte"), ("c", "{}")])
    assert (res.appended, res.duplicates) == (2, 0)
    assert [r[0] for r in res.rejected] == ["b"] and "NUL" in res.rejected[0][1]
    assert [e for (e,) in query(dsn, "SELECT event_id FROM airflow_txn.log_events ORDER BY lsn")] == ["a", "c"]


@pytest.mark.parametrize("events, match", [
    ([("a", None)], "payload must be a str"),
    ([("a", {"url": 1})], "payload must be a str"),
    ([(None, "{}")], "event id must be a non-empty string"),
    ([("a",)], "give \\(event_id, payload\\) pairs"),
    ("abc", "iterable of \\(event_id, payload\\) pairs"),
])
def test_a_malformed_append_is_refused_whole_with_the_fix(dsn: str, events: object, match: str) -> None:
    log = make_log(dsn, partitions=1)
    with pytest.raises(ConfigError, match=match):
        log.append(events)  # type: ignore[arg-type]
    assert query(dsn, "SELECT count(*) FROM airflow_txn.log_events") == [(0,)]


# -- the command line ------------------------------------------------------------------------

def test_cli_errors_are_one_line_without_secrets(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["--dsn", "postgresql://u:s3cr%zzet@127.0.0.1/db", "status", "x"]) == 1
    err = capsys.readouterr().err
    assert "s3cr" not in err and "malformed" in err and "Traceback" not in err and err.count("\n") == 1
    assert cli(["--dsn", dsn, "--schema", "Bad", "status", "x"]) == 1
    assert "invalid schema name 'Bad'" in capsys.readouterr().err
    assert cli(["--dsn", dsn, "commits", "nosuch"]) == 1
    assert "topology 'nosuch' is not registered" in capsys.readouterr().err
    assert cli(["--dsn", "host=127.0.0.1 port=1 dbname=x user=u password=s3cret", "status", "x"]) == 1
    err = capsys.readouterr().err
    assert "s3cret" not in err and "Connection refused" in err


def test_cli_reads_the_dsn_from_a_private_file(coordinator: Coordinator, dsn: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    make_log(dsn)
    coordinator.register(counting_topology())
    dsn_file = tmp_path / "dsn"
    dsn_file.write_text(dsn + "\n")
    os.chmod(dsn_file, 0o644)
    assert cli(["--dsn-file", str(dsn_file), "status", "clicks"]) == 1
    assert f"chmod 600 {dsn_file}" in capsys.readouterr().err
    os.chmod(dsn_file, 0o600)
    assert cli(["--dsn-file", str(dsn_file), "status", "clicks"]) == 0


def test_cli_commits_is_a_table_or_json_and_survives_a_closed_pipe(coordinator: Coordinator, dsn: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    make_log(dsn).append([click(i) for i in range(120)])
    coordinator.register(counting_topology())
    for n in range(3):
        run_one(coordinator, "clicks", f"r{n}")
    assert cli(["--dsn", dsn, "commits", "clicks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["txid", "attempt"] and [ln.split()[0] for ln in lines[1:]] == ["1", "2", "3"]
    assert cli(["--dsn", dsn, "commits", "clicks", "--json"]) == 0
    assert [json.loads(ln)["txid"] for ln in capsys.readouterr().out.splitlines()] == [1, 2, 3]
    airflow_txn = str(Path(sys.executable).with_name("airflow-txn"))
    res = subprocess.run(f"'{airflow_txn}' commits clicks | head -1", shell=True, capture_output=True, text=True,
                         env={**os.environ, "AIRFLOW_TXN_DSN": dsn}, check=False)
    assert res.stdout.startswith("  txid") and "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr


def test_an_event_log_on_a_malformed_dsn_says_so_without_the_password() -> None:
    with pytest.raises(ConfigError) as err:
        EventLog("postgresql://u:s3cr%zzet@127.0.0.1/db", "x").create(1)
    assert "s3cr" not in str(err.value) and "percent-encode" in str(err.value)


@pytest.mark.parametrize("kind", ["transactional", "opaque"])
def test_reserved_words_as_names_commit_because_every_name_is_quoted(coordinator: Coordinator, dsn: str,
                                                                     kind: str) -> None:
    make_log(dsn, "select").append([click(i) for i in range(20)])
    spec = TopologySpec("order", PostgresLogSource("select"),
                        [StateSpec("user", {"user": "text"}, combiner="sum", kind=kind, table="group")])
    coordinator.register(spec)

    def fn(rec: dict[str, object]) -> list[tuple[str, tuple[object, ...], object]]:
        return [("user", (rec["user"],), rec["amount"])]

    run_one(coordinator, "order", "r1", fn)
    assert sum(table(dsn, '"group"').values()) == sum(i % 11 for i in range(20))


# -- rebuilds --------------------------------------------------------------------------------

def test_an_aborted_rebuild_can_never_swap_and_a_live_one_is_not_aborted_by_accident(dsn: str) -> None:
    from airflow_transactional import rebuild

    make_log(dsn).append([click(i) for i in range(30)])
    owner, operator = Coordinator(dsn), Coordinator(dsn)
    try:
        owner.register(counting_topology())
        run_one(owner, "clicks", "r1")
        mine = rebuild.begin(owner, "clicks")
        with pytest.raises(rebuild.RebuildInProgress, match=r"still running.*--force"):
            rebuild.abort(operator, "clicks")
        with pytest.raises(rebuild.RebuildInProgress, match="has a rebuild running"):
            rebuild.begin(operator, "clicks")
        assert rebuild.abort(operator, "clicks", force=True)
        with pytest.raises(Exception, match=f"rebuild {mine.rebuild_id} .* was aborted or replaced"):
            rebuild.swap(owner, mine)
        assert not rebuild.abort(owner, "clicks", rebuild=mine)  # its own clean-up touches nothing else
        theirs = rebuild.begin(operator, "clicks")  # the lock is free again
        assert theirs.rebuild_id != mine.rebuild_id
        operator.close()  # its process died: the lock goes with the session
        assert rebuild.abort(owner, "clicks")  # no --force needed for a dead rebuild
    finally:
        owner.close()
        operator.close()


# -- least privilege: an owner, a run-time role, a producer ------------------------------------

def test_three_roles_each_with_only_what_it_needs(pg: EmbeddedPostgres, dsn: str, tmp_path: Path) -> None:
    import uuid

    from psycopg2.extensions import make_dsn, parse_dsn

    from airflow_transactional.processing import process_batch

    suffix = uuid.uuid4().hex[:6]
    roles = {r: f"{r}_{suffix}" for r in ("owner", "runtime", "producer")}
    dbname = parse_dsn(dsn)["dbname"]

    def as_role(role: str) -> str:
        return make_dsn(dsn, user=roles[role], password="pw-" + suffix)

    def admin(statement: str, database: str = dbname) -> None:
        conn = psycopg2.connect(pg.admin_dsn(database))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(statement)
        conn.close()

    for name in roles.values():
        admin(f"CREATE ROLE {name} LOGIN PASSWORD 'pw-{suffix}'")
    try:
        # What a DBA does once: the owner owns the provider's schema and may create state tables
        # in public -- and has no CREATE on the database.
        admin(f"CREATE SCHEMA airflow_txn AUTHORIZATION {roles['owner']}")
        admin(f"GRANT USAGE, CREATE ON SCHEMA public TO {roles['owner']}")
        owner = Coordinator(as_role("owner"))
        owner.migrate()  # owning the schema is enough
        make_log(as_role("owner"), "clicks")
        make_log(as_role("owner"), "other")
        dag_file = tmp_path / "clicks_dag.py"
        dag_file.write_text(DAG_FILE.format(job=Path(__file__).resolve().parents[2] / "spark_jobs" / "words.py"))
        assert cli(["--dsn", as_role("owner"), "register", str(dag_file)]) == 0
        assert cli(["--dsn", as_role("owner"), "grant", "--runtime-role", roles["runtime"],
                    "--producer-role", roles["producer"], "--log", "clicks"]) == 0

        producer = EventLog(as_role("producer"), "clicks")
        assert producer.append([click(i) for i in range(30)]).appended == 30
        with pytest.raises(ConfigError, match="log 'other' does not exist"):  # its rows are invisible
            EventLog(as_role("producer"), "other").append([click(99)])
        for forbidden in ("SELECT * FROM airflow_txn.topologies", "DELETE FROM airflow_txn.log_events",
                          "SELECT * FROM clicks_count"):
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                query(as_role("producer"), forbidden)

        runtime = Coordinator(as_role("runtime"))
        spec = TopologySpec.from_config(owner.spec("clicks").to_config())
        runtime.register(spec)  # unchanged: no DDL needed
        txn = runtime.plan("clicks", "r1")
        process_batch(runtime, "clicks", txn.txid, lambda r: [("clicks_count", (r["user"],), 1),
                                                              ("clicks_amount", (r["user"],), r["amount"])])
        assert runtime.commit("clicks", txn.txid).committed
        assert sum(table(as_role("runtime"), "clicks_count").values()) == 30
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            query(as_role("runtime"), "DROP TABLE clicks_count")
        new = TopologySpec("fresh", PostgresLogSource("clicks"), [StateSpec("fresh_count", {"k": "text"})])
        with pytest.raises(ConfigError, match="only the schema's owner may do"):
            runtime.register(new)
        runtime.close()
        owner.close()
    finally:
        admin("DROP SCHEMA IF EXISTS airflow_txn CASCADE; DROP TABLE IF EXISTS clicks_count, clicks_amount")
        for name in roles.values():
            admin(f"DROP OWNED BY {name}; DROP ROLE {name}")


DAG_FILE = """
from datetime import timedelta
from airflow_transactional import PostgresLogSource, StateSpec, transactional_dag

dag = transactional_dag(
    "clicks", source=PostgresLogSource("clicks"),
    states=[StateSpec("clicks_count", {{"user_id": "text"}}, combiner="count"),
            StateSpec("clicks_amount", {{"user_id": "text"}}, combiner="sum")],
    application="{job}", schedule=timedelta(minutes=5), max_batch_size=50)
"""
