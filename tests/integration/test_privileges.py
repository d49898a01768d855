"""store/privileges.py: least privilege -- an owner registers, a run-time role plans, processes
and commits, a producer only appends; each refused what it does not need."""

from __future__ import annotations

from pathlib import Path

import psycopg2
import pytest

from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from dev.embedded import EmbeddedPostgres
from tests.helpers import click, make_log, query, table

pytestmark = pytest.mark.integration


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
