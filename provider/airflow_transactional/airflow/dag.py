"""``transactional_dag``: one call declares a topology and returns a normal Airflow 3 DAG.

Each DAG run is one transaction: ``plan`` >> ``process`` (spark-submit) >> ``commit``.

Why no ``depends_on_past``: in Airflow 3.3 a run whose unfinished task has ``depends_on_past``
is exempt from deadlock detection (``DagRun.update_state``: ``should_schedule`` is False), so a
commit blocked by a failed predecessor would keep its run RUNNING and hold a
``max_active_runs`` slot forever -- the cleared run could then never start (docs/design.md, trap 2).
And ``depends_on_past`` is skipped for runs without a logical date and for the first run of a
backfill (trap 1). So the order lives in PostgreSQL: the commit task waits there for txid-1,
commits under a row lock only when ``txid == committed + 1``, and fails fast with "blocked by
failed txid N" when an earlier txid failed for good.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from airflow.sdk import DAG

from .. import quarantine
from ..exceptions import ConfigError
from ..sources.base import Source
from ..spark.submit import LOCAL_SPARK_CONF
from ..spec import DecisionSpec, OutputSpec, SparkJob, StateSpec, TopologySpec
from ..values import Combiner, ValueKind
from .assets import topology_assets
from .dag_checks import check_late_commit, check_names, check_settings, check_verify
from .deadlines import late_commit
from .operators import (
    CommitOperator,
    PlanOperator,
    PublishOperator,
    TransactionalSparkSubmitOperator,
    VerifyOperator,
)
from .priority import TransactionalPriority

__all__ = ["LOCAL_SPARK_CONF", "transactional_dag"]

DEFAULT_START = datetime(2024, 1, 1, tzinfo=UTC)

def _caller_dir() -> str:
    """The directory of the DAG file that called :func:`transactional_dag` (two frames up). Read
    off the frame, not ``inspect.stack()``, which reads the source of every frame's module: it
    cost every task process a tenth of a second per DAG in its file."""
    frame = sys._getframe(2)
    return os.path.dirname(os.path.realpath(frame.f_code.co_filename))  # a symlinked DAG file: its real home


def _resolve_application(application: str, base_dir: str) -> str:
    if not isinstance(application, str) or not application.endswith(".py"):
        raise ConfigError(f"application must be the path of a PySpark job file (*.py), got {application!r}")
    path = application if os.path.isabs(application) else os.path.join(base_dir, application)
    path = os.path.normpath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"Spark application {path} does not exist: give an absolute path, or one "
                          "relative to the DAG file")
    return path


def _resolve_py_files(py_files: Any, base_dir: str) -> str | None:
    """``py_files`` (comma-separated, as spark-submit takes it) with each local path made absolute
    relative to the DAG file, as ``application`` is; URLs (``s3://``, ``hdfs://``) as given."""
    if py_files is None:
        return None
    if not isinstance(py_files, str) or not py_files.strip():
        raise ConfigError(f"py_files must be comma-separated paths of .py, .zip or .egg files, got {py_files!r}")
    items = [p.strip() for p in py_files.split(",") if p.strip()]
    return ",".join(p if "://" in p or os.path.isabs(p) else os.path.normpath(os.path.join(base_dir, p))
                    for p in items)


def transactional_dag(
    topology_id: str,
    *,
    source: Source,
    states: Sequence[StateSpec],
    application: str,
    outputs: Sequence[OutputSpec] = (),
    decisions: Sequence[DecisionSpec] = (),
    schedule: Any,
    max_in_flight: int = 3,
    max_batch_size: int = 100_000,
    opaque: bool = False,
    on_bad_record: str = "quarantine",
    max_quarantined: float | None = quarantine.DEFAULT_SHARE,
    transactional_conn_id: str = "transactional_default",
    spark_conn_id: str = "spark_default",
    spark_conf: Mapping[str, Any] | None = None,
    application_args: Sequence[str] = (),
    py_files: str | None = None,
    spark_pool: str | None = None,
    spark_connect_conn_id: str | None = None,
    kubernetes_dsn_secret: str | None = None,
    reuse_staged_output: bool = True,
    retries: int = 2,
    retry_delay: timedelta = timedelta(seconds=10),
    commit_timeout: timedelta = timedelta(hours=1),
    plan_timeout: timedelta = timedelta(minutes=30),
    deferrable: bool = True,
    defer_after: timedelta = timedelta(seconds=10),
    emit_assets: bool = True,
    stall_after: timedelta | Literal["auto"] | None = "auto",
    verify: str | None = None,
    verify_pool: str | None = None,
    verify_lag: int = 0,
    verify_conn_id: str | None = None,
    commit_deadline: timedelta | None = None,
    on_late_commit: Callable[..., Any] | str | None = None,
    start_date: datetime = DEFAULT_START,
    dag_id: str | None = None,
    tags: Sequence[str] = (),
    **dag_kwargs: Any,
) -> DAG:
    """Declare a transactional topology; returns the DAG (plan >> process >> commit). Everything is
    validated here, at parse time, without touching a database.

    :param topology_id: the topology's name in the state store (lower case, letters, digits, ``_``);
        also the DAG id unless ``dag_id`` says otherwise.
    :param source: where its batches come from: :class:`~airflow_transactional.EventLog`'s
        :class:`~airflow_transactional.PostgresLogSource`, a :class:`~airflow_transactional.LandingDirectory`
        or a :class:`~airflow_transactional.KafkaSource`.
    :param states: the state tables each commit updates (:class:`~airflow_transactional.StateSpec`).
    :param application: the PySpark job, built on :func:`airflow_transactional.spark_job.run` (a path
        relative to the DAG file, or absolute).
    :param outputs: event logs the commit appends the job's output events to
        (:class:`~airflow_transactional.OutputSpec`), each the source another topology may read.
    :param decisions: rules the commit applies to the job's requests one by one, per key in source
        order, on the committed state (:class:`~airflow_transactional.DecisionSpec`).
    :param schedule: the batch-emit interval (a cron string, ``timedelta`` or timetable); periodic,
        since Airflow can only backfill scheduled DAGs.
    :param max_in_flight: how many transactions process at once (Storm's ``max.spout.pending``; the
        DAG's ``max_active_runs``) while commits stay strictly ordered.
    :param max_batch_size: the most records (offsets for Kafka, files for a landing directory) one
        transaction's batch takes.
    :param opaque: an opaque topology re-plans a batch its source can no longer give and skips what
        retention removed (counted, reported); a transactional one (the default) fails instead.
    :param on_bad_record: ``"quarantine"`` (the default) sets a record the job cannot take aside with
        its reason; ``"fail"`` fails the attempt instead.
    :param max_quarantined: the share of a txid's records (of at least 20) it may set aside and still
        commit; above it the commit is refused with the top reasons and the fix, and the topology
        is blocked until the txid is processed again (:mod:`airflow_transactional.quarantine`).
        ``None``: never refused, for a topology that expects most records to be set aside.
    :param transactional_conn_id: the Airflow connection of the state store (type ``transactional``).
    :param spark_conn_id: the Airflow connection ``spark-submit`` runs with (type ``spark``).
    :param spark_conf: Spark settings for ``spark-submit`` (a Spark Connect server keeps its own).
    :param application_args: arguments passed on to the job after the provider's own.
    :param py_files: the modules the job imports (comma-separated, as ``spark-submit`` takes it; local
        paths relative to the DAG file), shipped with it to ``spark-submit``, to ``airflow-txn audit``
        and ``rebuild``, and onto a Spark Connect client's import path.
    :param spark_pool: an Airflow pool that caps how many ``spark-submit`` jobs run at once across
        topologies (size it to the cluster).
    :param spark_connect_conn_id: a ``spark_connect`` connection: batches then run on that long-lived
        Spark instead of one ``spark-submit`` each -- no JVM start-up per batch.
    :param kubernetes_dsn_secret: ``"name:key"`` of the Kubernetes secret a cluster-mode driver on
        Kubernetes reads the state store's DSN from (the DSN never leaves the secret).
    :param reuse_staged_output: a cleared or backfilled run whose batch was already processed
        completely (and is unchanged) commits that output instead of running the job again.
    :param retries: how often Airflow retries a failed task.
    :param retry_delay: how long Airflow waits before a retry.
    :param commit_timeout: how long a commit waits for its turn (txid - 1 committed) before it fails.
    :param plan_timeout: how long a plan waits for a slot of ``max_in_flight`` before it fails.
    :param deferrable: a commit waiting for txid - 1 and a plan waiting for a slot, once they have
        waited ``defer_after`` in their worker, wait in Airflow's triggerer, holding no worker slot,
        and wake when the topology commits; False makes them poll in their worker (a deployment
        without a triggerer).
    :param defer_after: how long a wait stays in its worker before it defers.
    :param emit_assets: each commit updates one Airflow asset per state table
        (:func:`airflow_transactional.state_asset`) and per output log
        (:func:`airflow_transactional.output_asset`), with the txid as the event's partition key.
    :param stall_after: the stall rule: a topology that has not committed for this long while its
        source holds records is *stalled* (its status and Transactions page say so as its blocker,
        with what the next txid waits for). ``"auto"``: ten times the schedule's usual interval, at
        least 5 minutes (30 for a schedule without an interval, such as assets); None: no rule.
    :param verify: the shadow audit (docs/guides/verification.md): each run ends with a ``verify``
        task, a round of it after the commit -- ``"N"`` checks up to N committed txids, ``"N:K"`` 1
        in K of them (a retried, cleared or corrected txid always) -- that fails while a check has
        failed; None (the default): no verify task.
    :param verify_pool: the Airflow pool of the verify task (give it one of its own, so a round never
        takes a slot of ``spark_pool``); the task runs at the lowest priority.
    :param verify_lag: how many committed txids waiting to be recomputed the verify task may leave
        to a later run's round (0, the default: each round recomputes what waits). With ``L``, the
        task starts its job once more than ``L`` wait, and the job recomputes them together -- one
        driver start for all of them instead of one each -- while the mark trails the commits by at
        most ``L`` txids to recompute. Less than the round's ``N``.
    :param verify_conn_id: the connection the verify task connects with (default:
        ``transactional_conn_id``) -- an auditor role's, granted with ``airflow-txn grant
        --auditor-role``: it alone then writes the verdicts and the mark, not the role that commits.
    :param commit_deadline: an Airflow deadline alert on every run: not committed within this long of
        being queued, it calls ``on_late_commit`` in the triggerer. Not on by default: Airflow 3.3
        fails to clear a run whose queued-at deadline has not passed yet (apache/airflow#70368).
    :param on_late_commit: a coroutine or its dotted path; default
        :func:`airflow_transactional.airflow.deadlines.late_commit` (a warning with the topology's
        blocker, and the metrics ``late_commits`` and, when stalled, ``stalled``).
    :param start_date: the DAG's start date, with a time zone.
    :param dag_id: the DAG's id (default: ``topology_id``); one DAG runs a topology.
    :param tags: the DAG's tags, besides ``transactional``.
    :param dag_kwargs: passed on to Airflow's ``DAG`` (``catchup`` is False unless given).
    """
    if schedule is None or schedule in ("@once", "@continuous"):
        raise ConfigError(
            f"topology {topology_id!r}: give a periodic schedule (e.g. timedelta(minutes=1) or '*/5 * * * *'), "
            f"not {schedule!r}: it is the batch-emit interval, and Airflow can only backfill DAGs with a schedule")
    py_files = _resolve_py_files(py_files, _caller_dir())
    spec = TopologySpec(topology_id, source, states, max_in_flight=max_in_flight,
                        max_batch_size=max_batch_size, opaque=opaque, on_bad_record=on_bad_record, outputs=outputs,
                        decisions=decisions, max_quarantined=max_quarantined,
                        job=SparkJob(_resolve_application(application, _caller_dir()), application_args,
                                     py_files),  # what the job imports besides itself: audit and rebuild ship it too
                        # One DAG runs a topology: a second one would claim its runs' txids.
                        dag_id=dag_id or topology_id, stall_after_seconds=stall_rule(schedule, stall_after))
    for name, value in (("stall_after", stall_after), ("commit_deadline", commit_deadline)):
        if value is not None and (value, name) != ("auto", "stall_after") and (
                not isinstance(value, timedelta) or value <= timedelta(0)):
            raise ConfigError(f"{name} must be a positive timedelta (e.g. timedelta(minutes=10)), got {value!r}")
    if commit_deadline is None and on_late_commit is not None:
        raise ConfigError("on_late_commit needs commit_deadline: say how long a run may take to commit")
    check_names(transactional_conn_id=transactional_conn_id, spark_conn_id=spark_conn_id, spark_pool=spark_pool,
                 start_date=start_date, commit_deadline=commit_deadline)
    check_verify(verify, verify_pool, verify_lag, verify_conn_id)
    check_settings(retries=retries, defer_after=defer_after, retry_delay=retry_delay,
                    commit_timeout=commit_timeout, plan_timeout=plan_timeout, deferrable=deferrable,
                    emit_assets=emit_assets, tags=tags,
                    spark_connect_conn_id=spark_connect_conn_id, spark_conf=spark_conf,
                    kubernetes_dsn_secret=kubernetes_dsn_secret)
    if commit_deadline is not None:
        dag_kwargs["deadline"] = _deadlines(dag_kwargs.get("deadline"), topology_id, commit_deadline, on_late_commit,
                                            transactional_conn_id)
    config = spec.to_config()
    dag = DAG(
        dag_id=dag_id or topology_id,
        schedule=schedule,
        start_date=start_date,
        catchup=dag_kwargs.pop("catchup", False),
        max_active_runs=max_in_flight,
        tags=["transactional", *tags],
        doc_md=dag_kwargs.pop("doc_md", None) or _doc(spec),
        default_args={"retries": retries, "retry_delay": retry_delay},
        **dag_kwargs,
    )
    _add_tasks(dag, spec, config, transactional_conn_id=transactional_conn_id, spark_conn_id=spark_conn_id,
               spark_conf=spark_conf, application_args=application_args, py_files=py_files, spark_pool=spark_pool,
               spark_connect_conn_id=spark_connect_conn_id, kubernetes_dsn_secret=kubernetes_dsn_secret,
               reuse_staged_output=reuse_staged_output, commit_timeout=commit_timeout, plan_timeout=plan_timeout,
               deferrable=deferrable, defer_after=defer_after, emit_assets=emit_assets, verify=verify,
               verify_pool=verify_pool, verify_lag=verify_lag, verify_conn_id=verify_conn_id)
    try:
        dag.timetable.validate()  # a bad cron string is otherwise accepted here and fails in the scheduler
    except Exception as exc:
        raise ConfigError(f"topology {topology_id!r}: schedule {schedule!r} is not valid ({exc}): give a cron "
                          "string such as '*/5 * * * *', a timedelta, or a timetable") from None
    return dag


def _add_tasks(dag: DAG, spec: TopologySpec, config: dict[str, Any], *, transactional_conn_id: str,
               spark_conn_id: str, spark_conf: Mapping[str, Any] | None, application_args: Sequence[str],
               py_files: str | None, spark_pool: str | None, spark_connect_conn_id: str | None,
               kubernetes_dsn_secret: str | None, reuse_staged_output: bool, commit_timeout: timedelta,
               plan_timeout: timedelta, deferrable: bool, defer_after: timedelta, emit_assets: bool,
               verify: str | None, verify_pool: str | None, verify_lag: int, verify_conn_id: str | None) -> None:
    """plan >> process >> commit (>> publish, >> verify), in ``dag``."""
    topology_id = spec.topology_id
    # Asset-triggered runs (the later stages of a pipeline) are not starved by other DAGs' scheduled runs.
    common: dict[str, Any] = {"topology": config, "transactional_conn_id": transactional_conn_id, "dag": dag,
                              "weight_rule": TransactionalPriority()}
    waits: dict[str, Any] = {"deferrable": deferrable, "defer_after": defer_after}
    plan = PlanOperator(task_id="plan", wait_timeout=plan_timeout, **waits, **common)
    job: dict[str, Any] = {
        "application": config["job"]["application"], "application_args": list(application_args),
        "conn_id": spark_conn_id, "conf": dict(spark_conf or {}), "py_files": py_files,
        "spark_connect_conn_id": spark_connect_conn_id, "kubernetes_dsn_secret": kubernetes_dsn_secret}
    process = TransactionalSparkSubmitOperator(
        task_id="process", name=f"txn-{topology_id}", reuse_staged_output=reuse_staged_output,
        **({"pool": spark_pool} if spark_pool else {}), **job, **common)
    # The commit runs after a skipped (empty) process too; it must never run after a failed one.
    commit = CommitOperator(task_id="commit", wait_timeout=commit_timeout, trigger_rule="none_failed",
                            outlets=topology_assets(spec) if emit_assets else [], **waits,
                            execution_timeout=commit_timeout + timedelta(minutes=5), **common)
    plan >> process >> commit
    if any(o.kafka_topic for o in spec.outputs):  # committed output published to Kafka, after the commit
        commit >> PublishOperator(task_id="publish", **common)
    if verify is not None:  # a round of the shadow audit, never before the commit, last in line for a slot
        commit >> VerifyOperator(task_id="verify", name=f"txn-{topology_id}-verify", verify_round=verify,
                                 verify_lag=verify_lag, priority_weight=1,
                                 **({"pool": verify_pool} if verify_pool else {}), **job,
                                 **{**common, "weight_rule": "absolute",
                                    "transactional_conn_id": verify_conn_id or transactional_conn_id})


def stall_rule(schedule: Any, stall_after: Any) -> int | None:
    """The declaration's stall rule (see :func:`transactional_dag`) in seconds, or None for
    ``stall_after=None``."""
    if stall_after is None or (isinstance(stall_after, timedelta) and stall_after <= timedelta(0)):
        return None
    if isinstance(stall_after, timedelta):
        return max(1, int(stall_after.total_seconds()))
    if stall_after != "auto":
        return None  # refused by the caller, with the fix
    interval = schedule_interval(schedule)
    return 1800 if interval is None else max(300, 10 * int(interval.total_seconds()))


def schedule_interval(schedule: Any) -> timedelta | None:
    """The usual gap between two runs of ``schedule`` (a timedelta; a cron string or preset: the
    median gap of its next ten runs), else None (assets, a timetable; a bad cron string is refused
    later, with Airflow's message)."""
    if isinstance(schedule, timedelta):
        return schedule
    if not isinstance(schedule, str):
        return None
    from airflow.sdk.definitions.timetables._cron import CRON_PRESETS
    from croniter import croniter

    try:
        runs = croniter(CRON_PRESETS.get(schedule, schedule), DEFAULT_START)
        times = [runs.get_next(datetime) for _ in range(11)]
    except (ValueError, KeyError, TypeError):
        return None
    return sorted(b - a for a, b in itertools.pairwise(times))[5]


def _deadlines(given: Any, topology_id: str, interval: timedelta, callback: Callable[..., Any] | str | None,
               conn_id: str) -> list[Any]:
    """The DAG's deadline alerts: the user's own (``deadline=``), and the commit deadline (whose
    default callback reads the topology's status through the DAG's connection)."""
    from airflow.sdk.definitions.callback import AsyncCallback
    from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

    if callback is not None:
        check_late_commit(callback)
    try:
        alert = DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=interval,
                              callback=AsyncCallback(callback or late_commit, kwargs={
                                  "topology_id": topology_id, **({} if callback else {"conn_id": conn_id})}),
                              name=f"{topology_id} commit deadline")
    except (AttributeError, ImportError, ValueError, TypeError) as exc:
        raise ConfigError(f"topology {topology_id!r}: on_late_commit must be a coroutine function (async def) "
                          f"or its dotted path, importable where the triggerer runs ({exc})") from None
    mine = [] if given is None else [given] if isinstance(given, DeadlineAlert) else list(given)
    return [*mine, alert]


def _doc(spec: TopologySpec) -> str:
    states = "\n".join(f"- `{s.name}`: keys {', '.join(s.key_columns)}, {Combiner.parse(s.combiner).value} "
                       f"({ValueKind.parse(s.kind).value} values)" for s in spec.states)
    outputs = "".join(f"- `{o.name}`: appends to event log `{o.log_name}`\n" for o in spec.outputs)
    outputs += "".join(f"- decision `{d.name}`: grants requests while `{d.state}` (plus "
                       f"{d.headroom or 'nothing'}) stays at or above {d.floor}\n" for d in spec.decisions)
    return (f"### Transactional topology `{spec.topology_id}`\n\n"
            f"Source: `{spec.source!r}`\n\nStates:\n{states}\n\n"
            + (f"Outputs:\n{outputs}\n" if outputs else "") +
            f"Each run is one transaction: **plan** fixes the batch, **process** runs spark-submit, "
            f"**commit** applies it strictly in txid order (max {spec.max_in_flight} in flight). "
            "Check it with `airflow-txn status " + spec.topology_id + "`.")
