"""The DAG API at parse time: every example DAG loads, the generated DAG has the right shape,
bad declarations fail with a message that names the fix, and nothing touches a database."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_transactional import LandingDirectory, PostgresLogSource, StateSpec, get_provider_info
from airflow_transactional.dag import transactional_dag
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.hooks import dsn_from_fields

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
WORDS_JOB = str(REPO / "spark_jobs" / "words.py")


@pytest.fixture(autouse=True)
def _no_database(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse time must not connect anywhere: any connection attempt fails the test."""
    import psycopg2

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("a database was touched at DAG-parse time")

    monkeypatch.setattr(psycopg2, "connect", refuse)


def _dag(**overrides: object):  # type: ignore[no-untyped-def]
    kwargs: dict[str, object] = {
        "source": PostgresLogSource("tweets"),
        "states": [StateSpec("url_counts", {"url": "text"}, combiner="count")],
        "application": WORDS_JOB,
        "schedule": timedelta(minutes=5),
    }
    kwargs.update(overrides)
    return transactional_dag("t_words", **kwargs)  # type: ignore[arg-type]


def test_every_example_dag_loads_without_import_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_TXN_LANDING_DIR", str(tmp_path))
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {"words", "global_count", "landing_orders"}
    for dag in bag.dags.values():
        assert [t.task_id for t in dag.tasks] == ["plan", "process", "commit"]


def test_generated_dag_plans_processes_and_commits_in_postgres_order() -> None:
    dag = _dag(max_in_flight=4, spark_pool="spark")
    plan, process, commit = (dag.get_task(t) for t in ("plan", "process", "commit"))
    assert dag.max_active_runs == 4
    assert dag.catchup is False
    assert plan.downstream_task_ids == {"process"} and process.downstream_task_ids == {"commit"}
    # Order is enforced in Postgres; depends_on_past would deadlock max_active_runs (trap 2).
    assert not any(t.depends_on_past for t in dag.tasks)
    assert commit.trigger_rule == "none_failed"  # runs after an empty (skipped) batch
    assert process.application == WORDS_JOB
    assert process.pool == "spark"
    assert plan.topology["extra"]["spark"]["application"] == WORDS_JOB
    assert plan.topology["max_in_flight"] == 4


def test_relative_application_paths_resolve_against_the_dag_file() -> None:
    dag = _dag(application="../../spark_jobs/words.py")
    assert dag.get_task("process").application == WORDS_JOB


@pytest.mark.parametrize(("overrides", "fix"), [
    ({"schedule": None}, "give a periodic schedule"),
    ({"application": "/nowhere/job.py"}, "does not exist"),
    ({"application": "job.jar"}, "PySpark job file"),
    ({"states": []}, "give at least one StateSpec"),
    ({"max_in_flight": 0}, "max_in_flight must be an integer from 1 to 100,000"),
    ({"retries": -1}, "retries must be an integer from 0 to 100"),
    ({"on_bad_record": "drop"}, "'quarantine' or 'fail'"),
    # what a careless hand writes, refused instead of silently accepted
    ({"opaque": "no"}, "opaque must be True or False"),
    ({"max_batch_size": 10**15}, "max_batch_size must be an integer from 1 to 100,000,000"),
    ({"max_in_flight": 10**6}, "max_in_flight must be an integer from 1 to 100,000"),
    ({"schedule": "*/5 * * bogus"}, "schedule '\\*/5 \\* \\* bogus' is not valid"),
    ({"commit_timeout": timedelta(seconds=-1)}, "commit_timeout must be a positive timedelta"),
    ({"plan_timeout": 30}, "plan_timeout must be a positive timedelta"),
    ({"retry_delay": timedelta(0)}, "retry_delay must be a positive timedelta"),
    ({"tags": "abc"}, "tags must be a list of strings"),
    ({"application_args": "--flag"}, "application_args must be a list of strings"),
    ({"states": [StateSpec("c", {"k": "text"})], "source": LandingDirectory("/in", pattern="*.json")}, None),
])
def test_bad_declarations_fail_at_parse_time_naming_the_fix(overrides: dict[str, object], fix: str | None) -> None:
    if fix is None:  # the control: a good declaration of the same shape is accepted
        _dag(**overrides)
        return
    with pytest.raises(ConfigError, match=fix):
        _dag(**overrides)


@pytest.mark.parametrize(("build", "fix"), [
    (lambda: StateSpec("url_counts\n", {"url": "text"}), "invalid state name"),
    (lambda: StateSpec("c", {"url\n": "text"}), "invalid column name"),
    (lambda: PostgresLogSource("tweets\n"), "invalid log name"),
    (lambda: StateSpec("c", ["url"]), "keys must map each key column to its SQL type"),
    (lambda: StateSpec("c", {"url": "text"}, table="public.t\n"), "invalid table name"),
    (lambda: LandingDirectory("/in", max_files=10**9), "max_files must be an integer from 1 to 100,000"),
    (lambda: LandingDirectory("/in", settle_seconds=-1), "settle_seconds must be a number"),
])
def test_bad_names_and_shapes_are_refused_naming_the_fix(build: object, fix: str) -> None:
    with pytest.raises(ConfigError, match=fix):
        build()  # type: ignore[operator]


def test_sql_reserved_words_are_allowed_as_names_because_every_name_is_quoted() -> None:
    state = StateSpec("order", {"user": "text", "select": "bigint"}, table="group")
    assert state.key_columns == ["user", "select"]


def test_bad_topology_id_and_landing_path_are_refused() -> None:
    with pytest.raises(ConfigError, match="topology id"):
        transactional_dag("Bad-Id", source=PostgresLogSource("tweets"),
                          states=[StateSpec("c", {"k": "text"})], application=WORDS_JOB, schedule="@daily")
    with pytest.raises(ConfigError, match="absolute path"):
        LandingDirectory("relative/dir")


def test_hook_builds_a_dsn_from_allowlisted_fields_only() -> None:
    dsn = dsn_from_fields(host="db", port=6543, login="app", password="s3cret", database="analytics",
                          extras={"sslmode": "require", "state_schema": "x", "sslcompression": "1",
                                  "host": "evil"})
    parts = dict(p.split("=", 1) for p in dsn.split())
    assert parts == {"host": "db", "port": "6543", "dbname": "analytics", "user": "app",
                     "password": "s3cret", "sslmode": "require"}


def test_provider_registers_its_connection_type_and_hook() -> None:
    info = get_provider_info()
    assert info["package-name"] == "airflow-provider-transactional"
    [conn_type] = info["connection-types"]
    assert conn_type["connection-type"] == "transactional"
    assert conn_type["hook-class-name"] == "airflow_transactional.hooks.TransactionalHook"
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    assert "airflow-provider-transactional" in ProvidersManager().providers
    hook = ProvidersManagerTaskRuntime().hooks["transactional"]
    assert hook is not None
    assert hook.hook_class_name == "airflow_transactional.hooks.TransactionalHook"
    assert hook.connection_testable


def test_connection_form_metadata_comes_from_provider_info_without_importing_the_hook() -> None:
    # Airflow 3.3's UI builds the "Add connection" form from provider info alone; a fresh
    # process must show our name and labels even though nothing imported the hook yet.
    probe = textwrap.dedent("""
        import json, sys
        from airflow.providers_manager import ProvidersManager
        [meta] = [m for m in ProvidersManager().iter_connection_type_hook_ui_metadata()
                  if m.connection_type == "transactional"]
        print(json.dumps({"hook_name": meta.hook_name, "behaviour": meta.field_behaviour,
                          "hook_imported": "airflow_transactional.hooks" in sys.modules}))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    from airflow_transactional.hooks import TransactionalHook

    assert got["hook_imported"] is False
    assert got["hook_name"] == TransactionalHook.hook_name == "Transactional state store (PostgreSQL)"
    assert got["behaviour"] == TransactionalHook.get_ui_field_behaviour()
    assert got["behaviour"]["relabeling"] == {"schema": "Database"}


def test_spark_driver_keeps_the_users_java_options_and_gets_quiet_logs() -> None:
    from airflow_transactional.dag import LOCAL_SPARK_CONF
    from airflow_transactional.spark_job import with_quiet_driver_logs

    conf = with_quiet_driver_logs(LOCAL_SPARK_CONF)
    opts = conf["spark.driver.extraJavaOptions"].split()
    assert opts[:2] == ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    assert opts[2].startswith("-Dlog4j2.configurationFile=file:")
    assert with_quiet_driver_logs(conf) == conf  # applied once
    own = {"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=file:/etc/mine.properties"}
    assert with_quiet_driver_logs(own) == own
    # ... and the shared settings object the examples pass is not changed by it
    assert "log4j2" not in LOCAL_SPARK_CONF["spark.driver.extraJavaOptions"]


def test_cli_finds_spark_submit_beside_its_python_when_path_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by the chaos harness: `airflow-txn audit` run as .venv/bin/airflow-txn without
    # .venv/bin on PATH could not start Spark.
    from airflow_transactional.cli import spark_submit
    from airflow_transactional.exceptions import TransactionalError

    monkeypatch.delenv("SPARK_SUBMIT", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert spark_submit() == str(Path(sys.executable).with_name("spark-submit"))
    monkeypatch.setenv("SPARK_SUBMIT", "/opt/spark/bin/spark-submit")
    assert spark_submit() == "/opt/spark/bin/spark-submit"
    monkeypatch.delenv("SPARK_SUBMIT")
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with pytest.raises(TransactionalError, match="put Spark's bin directory on PATH or set SPARK_SUBMIT"):
        spark_submit()


def test_spark_connect_process_runs_the_job_as_a_client_and_reports_its_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With spark_connect_conn_id the process task runs the job file under its own Python with
    $SPARK_REMOTE from the connection (never in argv); a failing job fails the task with its output."""
    from airflow.sdk.exceptions import AirflowException

    monkeypatch.setenv("AIRFLOW_CONN_SC_TEST", json.dumps(
        {"conn_type": "spark_connect", "host": "sc://spark.example", "port": 15002, "password": "s3cret"}))
    job = tmp_path / "job.py"
    seen = tmp_path / "seen.json"
    job.write_text(textwrap.dedent(f"""
        import json, os, sys
        json.dump({{"remote": os.environ["SPARK_REMOTE"], "dsn": os.environ["AIRFLOW_TXN_DSN"], "argv": sys.argv[1:]}},
                  open({str(seen)!r}, "w"))
        print("the transform failed: boom")
        sys.exit(3)
    """))
    dag = _dag(application=str(job), spark_connect_conn_id="sc_test")
    process = dag.get_task("process")
    assert process.spark_connect_conn_id == "sc_test"
    process.application_args = ["--topology", "t_words", "--txid", "7"]
    with pytest.raises(AirflowException, match=r"(?s)job.py exited with 3.*the transform failed: boom") as err:
        process.run_connect_client("sc_test", "host=db password=pw")
    assert "s3cret" not in str(err.value)
    got = json.loads(seen.read_text())
    assert got["remote"].startswith("sc://spark.example:15002/") and "token=s3cret" in got["remote"]
    assert got["argv"] == ["--topology", "t_words", "--txid", "7"]  # no URL, no token, no DSN in argv
    assert got["dsn"] == "host=db password=pw"  # in the client's environment only


def test_rest_client_lists_every_run_past_the_apis_page_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by the chaos soak: the API silently caps a page at [api] maximum_page_limit (100), so a
    # client asking for limit=1000 saw only the oldest 100 runs -- past run 100 the harness took
    # the pipeline for idle, triggered hundreds of runs and never saw the failed run it had to clear.
    from urllib.parse import parse_qs, urlsplit

    from dev.localstack import RestClient

    every = [{"dag_run_id": f"r{i:03d}", "state": "success"} for i in range(250)]

    def get(path: str) -> dict[str, object]:
        query = {k: int(v[0]) for k, v in parse_qs(urlsplit(path).query).items() if k in ("limit", "offset")}
        offset, limit = query.get("offset", 0), min(query.get("limit", 50), 100)  # what the api-server does
        return {"dag_runs": every[offset:offset + limit], "total_entries": len(every)}

    client = RestClient.__new__(RestClient)
    monkeypatch.setattr(client, "get", get, raising=False)
    assert client.runs("d") == every
    assert client.runs("d", limit=120) == every[:120]
