"""The DAG API at parse time: every example DAG loads, the generated DAG has the right shape,
bad declarations fail with a message that names the fix, and nothing touches a database."""

from __future__ import annotations

import json
import textwrap
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from airflow_transactional import (
    DecisionSpec,
    LandingDirectory,
    OutputSpec,
    PostgresLogSource,
    StateSpec,
    TopologySpec,
    output_asset,
    state_asset,
)
from airflow_transactional.airflow.dag import transactional_dag
from airflow_transactional.exceptions import ConfigError

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
    assert set(bag.dag_ids) == {"words", "kafka_words", "global_count", "landing_orders", "s3_orders", "payments",
                                "settlement", "transactional_stall_watch"}
    for dag in bag.dags.values():
        assert [t.task_id for t in dag.tasks] == (["check"] if dag.dag_id == "transactional_stall_watch"
                                                  else ["plan", "process", "commit"])


@pytest.mark.parametrize("connect", [None, "spark_connect_default"])
def test_the_example_dags_move_onto_spark_connect_with_one_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  connect: str | None) -> None:
    """`make demo SPARK_CONNECT=1` sets AIRFLOW_TXN_SPARK_CONNECT_CONN_ID: every example's batches
    then run on that connection's server, with no spark_conf (which would not reach it)."""
    from airflow.dag_processing.dagbag import DagBag

    from airflow_transactional import LOCAL_SPARK_CONF
    from airflow_transactional.spark.submit import SPARK_CONNECT_CONN_ENV

    monkeypatch.setenv("AIRFLOW_TXN_LANDING_DIR", str(tmp_path))
    if connect:
        monkeypatch.setenv(SPARK_CONNECT_CONN_ENV, connect)
    else:
        monkeypatch.delenv(SPARK_CONNECT_CONN_ENV, raising=False)
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    processes = [d.get_task("process") for d in bag.dags.values() if d.dag_id != "transactional_stall_watch"]
    assert len(processes) == 7
    for task in processes:
        assert task.spark_connect_conn_id == connect, task.dag_id
        assert (task.conf or {}) == ({} if connect else LOCAL_SPARK_CONF), task.dag_id


def test_the_demo_runs_the_example_dags_of_this_repository(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Regression: the demo once looked for its DAGs one directory too high, found none, and gave up."""
    from airflow.dag_processing.dagbag import DagBag

    from dev import demo

    monkeypatch.setenv("AIRFLOW_TXN_LANDING_DIR", str(tmp_path))
    assert demo.DAGS_DIR == REPO / "dags"
    bag = DagBag(dag_folder=str(demo.DAGS_DIR))
    assert bag.import_errors == {} and {*demo.DAGS, demo.STALL_WATCH} <= set(bag.dag_ids)


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
    assert plan.topology["job"]["application"] == WORDS_JOB
    assert plan.topology["max_in_flight"] == 4
    # Waits: a few seconds in the worker, then in the triggerer (no worker slot held).
    assert plan.deferrable and commit.deferrable and commit.defer_after == timedelta(seconds=10)
    sleeping = _dag(deferrable=False, defer_after=timedelta(0))
    assert not sleeping.get_task("commit").deferrable and not sleeping.get_task("plan").deferrable
    # The commit updates one asset per state table (downstream DAGs schedule on it); only it.
    assert [a.name for a in commit.outlets] == ["transactional.t_words.url_counts"]
    assert commit.outlets == [state_asset("t_words", "url_counts")]
    assert not plan.outlets and not process.outlets
    assert _dag(emit_assets=False).get_task("commit").outlets == []
    # Output logs are assets too: a next stage schedules on them.
    chained = _dag(outputs=[OutputSpec("long_urls", partitions=2)])
    assert [a.name for a in chained.get_task("commit").outlets] == [
        "transactional.t_words.url_counts", "transactional.t_words.log.long_urls"]
    assert chained.get_task("commit").outlets[1] == output_asset("t_words", "long_urls")
    from airflow_transactional.airflow.assets import by_txid

    assert [by_txid(a) for a in chained.get_task("commit").outlets] == [True, False]
    assert chained.get_task("plan").topology["outputs"] == [{"name": "long_urls", "log": "long_urls", "partitions": 2}]
    assert "appends to event log `long_urls`" in chained.doc_md



async def _page_someone(*, topology_id: str, context: dict[str, object]) -> None:
    """A user's own late-commit callback."""


def test_a_commit_deadline_is_an_airflow_deadline_alert_on_every_run() -> None:
    from airflow.sdk.definitions.callback import AsyncCallback
    from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

    assert not _dag().deadline  # not by default (apache/airflow#70368: a clear inside the deadline fails)
    [alert] = _dag(commit_deadline=timedelta(minutes=10)).deadline
    assert alert.interval == timedelta(minutes=10)
    assert isinstance(alert.reference, type(DeadlineReference.DAGRUN_QUEUED_AT))
    assert alert.callback.path == "airflow_transactional.airflow.deadlines.late_commit"
    # The default callback reads the topology's status through the DAG's own connection.
    assert alert.callback.kwargs == {"topology_id": "t_words", "conn_id": "transactional_default"}
    # The user's own callback, and the user's own alerts kept beside it.
    theirs = DeadlineAlert(reference=DeadlineReference.DAGRUN_LOGICAL_DATE, interval=timedelta(hours=1),
                           callback=AsyncCallback(_page_someone))
    alerts = _dag(commit_deadline=timedelta(seconds=30), on_late_commit=_page_someone, deadline=theirs).deadline
    assert [a.interval for a in alerts] == [timedelta(hours=1), timedelta(seconds=30)]
    assert alerts[1].callback.path == f"{__name__}._page_someone"
    assert alerts[1].callback.kwargs == {"topology_id": "t_words"}  # the signature docs/guides/observability.md gives


@pytest.mark.parametrize(("schedule", "stall_after", "seconds"), [
    (timedelta(minutes=5), "auto", 3000),  # ten runs missed
    ("* * * * *", "auto", 600),
    (timedelta(seconds=10), "auto", 300),  # at least five minutes
    ("0 9 * * 1-5", "auto", 10 * 86400),  # the usual gap of weekday runs, not the weekend's
    ("@hourly", timedelta(minutes=90), 5400),  # as declared
])
def test_the_stall_rule_defaults_to_ten_runs_missed(schedule: object, stall_after: object, seconds: int) -> None:
    dag = _dag(schedule=schedule, stall_after=stall_after)
    assert dag.get_task("plan").topology["stall_after_seconds"] == seconds


def test_an_asset_scheduled_stage_stalls_after_half_an_hour_and_none_turns_the_rule_off() -> None:
    from airflow.sdk import Asset

    assert _dag(schedule=[Asset("x://y")]).get_task("plan").topology["stall_after_seconds"] == 1800
    assert "stall_after_seconds" not in _dag(stall_after=None).get_task("plan").topology


def test_the_kubernetes_secret_readme_documents_reaches_the_process_task() -> None:
    """Regression: transactional_dag(kubernetes_dsn_secret=...) raised TypeError from DAG.__init__."""
    dag = _dag(kubernetes_dsn_secret="txn-store:dsn")
    assert dag.get_task("process").kubernetes_dsn_secret == "txn-store:dsn"


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
    ({"deferrable": "yes"}, "deferrable must be True or False"),
    ({"emit_assets": 1}, "emit_assets must be True or False"),
    ({"commit_deadline": 600}, "commit_deadline must be a positive timedelta"),
    ({"on_late_commit": "pkg.page"}, "on_late_commit needs commit_deadline"),
    ({"stall_after": 600}, "stall_after must be a positive timedelta"),
    ({"commit_deadline": "auto"}, "commit_deadline must be a positive timedelta"),
    ({"commit_deadline": timedelta(minutes=1), "on_late_commit": print}, "must be a coroutine function"),
    ({"defer_after": timedelta(seconds=-1)}, "defer_after must be a timedelta of 0 or more"),
    ({"application_args": "--flag"}, "application_args must be a list of strings"),
    # the second review's careless hand
    ({"schedule": "@continuous"}, "give a periodic schedule .*not '@continuous'"),
    ({"decisions": DecisionSpec("pay", state="url_counts")}, "decisions must be a list, e.g. decisions="),
    ({"states": StateSpec("c", {"k": "text"})}, "states must be a list"),
    ({"spark_connect_conn_id": ""}, "spark_connect_conn_id must name a spark_connect connection"),
    ({"spark_connect_conn_id": 123}, "spark_connect_conn_id must name a spark_connect connection"),
    ({"spark_connect_conn_id": "sc", "spark_conf": {"spark.executor.memory": "4g"}},
     "spark_conf does not reach a Spark Connect server"),
    ({"commit_deadline": timedelta(minutes=1), "on_late_commit": "not.a.module"}, "cannot be imported"),
    ({"commit_deadline": timedelta(minutes=1), "on_late_commit": "json.dumps"}, "must be a coroutine function"),
    ({"spark_conf": {"spark.authenticate.secret": "hunter2"}}, "would be on spark-submit's command line"),
    # the third review's careless hand
    ({"transactional_conn_id": ""}, "transactional_conn_id must name an Airflow connection"),
    ({"spark_conn_id": "spark default"}, "spark_conn_id must name an Airflow connection"),
    ({"spark_pool": ""}, "spark_pool must name an Airflow pool"),
    ({"start_date": datetime(2026, 1, 1)}, "start_date must be a datetime with a time zone"),
    ({"spark_connect_conn_id": "no such"}, "spark_connect_conn_id must name a spark_connect connection"),
    ({"spark_connect_conn_id": "spark_connect_default"}, None),
    ({"commit_deadline": timedelta(days=36500)}, "commit_deadline must be at most 365 days"),
    ({"kubernetes_dsn_secret": "a" * 300 + ":dsn"}, "each at most 253 characters"),
    ({"kubernetes_dsn_secret": "Bad Name:dsn"}, "kubernetes_dsn_secret must be 'secret-name:key'"),
    ({"kubernetes_dsn_secret": "txn-store:dsn"}, None),
    ({"commit_deadline": timedelta(minutes=1),
      "on_late_commit": "airflow_transactional.airflow.deadlines.late_commit"}, None),
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
    (lambda: LandingDirectory("/in", max_batch_bytes=0), "max_batch_bytes must be a number of bytes from 1"),
    (lambda: LandingDirectory("s3a://b/in", max_batch_bytes="5GB"), "max_batch_bytes must be a number of bytes"),
    (lambda: LandingDirectory("/in/a\0b"), "without NUL bytes"),
    (lambda: DecisionSpec("pay", state="s", floor=float("nan")), "floor must be a finite number"),
    (lambda: DecisionSpec("pay", state="s", floor=float("-inf")), "floor must be a finite number"),
    (lambda: TopologySpec("t", PostgresLogSource("l"), [StateSpec("s", {"k": "text"})],
                          decisions=[DecisionSpec("pay", state="s", floor=10**40)]), "outside what its state"),
    (lambda: DecisionSpec("pay", state="s", headroom="pg_catalog.pg_authid"), "belongs to PostgreSQL itself"),
    (lambda: StateSpec("c", {"k": "text"}, schema="information_schema"), "belongs to PostgreSQL itself"),
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


def test_py_files_resolve_against_the_dag_file_reach_audits_and_a_spark_connect_client(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's own modules (``py_files``) are found wherever the job runs: spark-submit's
    --py-files (relative paths taken from the DAG file, like ``application``), the record that
    audit and rebuild ship with the job, and a Spark Connect client's import path."""
    from airflow_transactional.spark.recompute import client_path

    dag = _dag(py_files="../../spark_jobs/words.py, s3://bucket/lib.zip")
    process = dag.get_task("process")
    assert process.py_files == f"{WORDS_JOB},s3://bucket/lib.zip"
    assert process.topology["job"]["py_files"] == process.py_files  # audit and rebuild: --py-files
    assert "py_files" not in _dag().get_task("process").topology["job"]  # none: nothing recorded
    assert client_path(process.py_files) == [str(REPO / "spark_jobs")]
    assert client_path("/lib/a.zip,/jobs/x.py,/jobs/y.py") == ["/lib/a.zip", "/jobs"]
    with pytest.raises(ConfigError, match="py_files must be comma-separated paths"):
        _dag(py_files=" ")

    # The client imports the job's module from py_files, as a driver under spark-submit would.
    monkeypatch.setenv("AIRFLOW_CONN_SC_TEST", json.dumps(
        {"conn_type": "spark_connect", "host": "sc://spark.example", "port": 15002, "password": "t"}))
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "helper_mod.py").write_text("ANSWER = 42\n")
    job = tmp_path / "job.py"
    job.write_text("import sys\nfrom helper_mod import ANSWER\nsys.exit(0 if ANSWER == 42 else 1)\n")
    client = _dag(application=str(job), spark_connect_conn_id="sc_test",
                  py_files=str(lib / "helper_mod.py")).get_task("process")
    client.application_args = []
    client.run_connect_client("sc_test", "host=db")  # raises if the client could not import it


def test_asset_triggered_runs_go_first_and_a_run_finishes_before_the_next_starts() -> None:
    """The weight the scheduler orders waiting tasks by, computed as Airflow does it: on the
    serialized DAG (the strategy stored by name, loaded from the provider's plugin), when the task
    instance of a run is created."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.serialization.serialized_objects import DagSerialization

    from airflow_transactional.airflow.priority import ASSET_TRIGGERED_BOOST

    served = DagSerialization.from_dict(DagSerialization.to_dict(_dag()))

    def weight(task_id: str, run_id: str) -> int:
        ti = TaskInstance(task=served.get_task(task_id), run_id=run_id, dag_version_id=None)
        return int(ti.priority_weight)

    scheduled = {t: weight(t, "scheduled__2025-01-01T00:00:00+00:00") for t in ("plan", "process", "commit")}
    assert scheduled == {"plan": 1, "process": 2, "commit": 3}  # finish a transaction before starting one
    assert weight("process", "manual__2025-01-01T00:00:00+00:00") == 2
    assert weight("process", "backfill__2025-01-01T00:00:00+00:00") == 2
    # A run started by an asset event has no logical date, which Airflow sorts after every dated
    # run: its tasks outweigh any scheduled run's instead.
    for t in ("plan", "process", "commit"):
        assert weight(t, "asset_triggered__2025-01-01T00:00:00+00:00") == scheduled[t] + ASSET_TRIGGERED_BOOST
    assert min(weight(t, "asset_triggered__x") for t in scheduled) > max(scheduled.values())


def test_the_examples_runs_fall_on_whole_minutes_so_a_backfill_finds_them(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    """Airflow's Backfill dialog creates runs at the schedule's own times and reprocesses the runs
    already there: a timedelta schedule (without catch-up) starts from the unpause time, at odd
    seconds, and a backfill over a failed minute would make new runs beside the failed one."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.timetables.base import TimeRestriction

    monkeypatch.setenv("AIRFLOW_TXN_LANDING_DIR", str(tmp_path))
    monkeypatch.delenv("AIRFLOW_TXN_EXAMPLE_SCHEDULE", raising=False)
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.dags
    for dag_id, dag in bag.dags.items():
        served = DagSerialization.from_dict(DagSerialization.to_dict(dag))  # as the scheduler sees it
        info = served.timetable.next_dagrun_info(
            last_automated_data_interval=None,
            restriction=TimeRestriction(earliest=served.start_date, latest=None, catchup=False))
        assert info is not None and info.logical_date is not None, dag_id
        assert (info.logical_date.second, info.logical_date.microsecond) == (0, 0), (dag_id, info.logical_date)
