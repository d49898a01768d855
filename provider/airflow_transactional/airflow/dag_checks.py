"""What :func:`~.dag.transactional_dag` refuses at parse time, with the fix: settings Airflow would
take and fail on at run time, or never."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from ..exceptions import ConfigError
from ..ranges import Round
from ..spark.auth import check_no_secret_on_argv
from ..spark.submit import check_kubernetes_secret
from .callbacks import imported

#: The longest ``commit_deadline`` taken: a run not committed within a year is not "late" but lost.
MAX_COMMIT_DEADLINE = timedelta(days=365)


def check_names(*, transactional_conn_id: Any, spark_conn_id: Any, spark_pool: Any, start_date: Any,
                 commit_deadline: timedelta | None) -> None:
    """Refuse what Airflow would take at parse and fail on at run time, or never: a connection id or
    a pool that cannot exist, a start date without a time zone, a deadline past any use."""
    for name, value in (("transactional_conn_id", transactional_conn_id), ("spark_conn_id", spark_conn_id),
                        ("spark_pool", spark_pool)):
        if value is None and name == "spark_pool":
            continue
        if not a_name(value):
            raise ConfigError(f"{name} must name an Airflow {'pool' if name == 'spark_pool' else 'connection'} "
                              f"(letters, digits, '_', '-', '.'), got {value!r}")
    if not isinstance(start_date, datetime) or start_date.tzinfo is None or start_date.utcoffset() is None:
        raise ConfigError(f"start_date must be a datetime with a time zone (e.g. datetime(2026, 1, 1, tzinfo=UTC)), "
                          f"got {start_date!r}: a naive one is read in whatever time zone the scheduler runs in")
    if commit_deadline is not None and commit_deadline > MAX_COMMIT_DEADLINE:
        raise ConfigError(f"commit_deadline must be at most {MAX_COMMIT_DEADLINE.days} days, got {commit_deadline}: "
                          "a run that late is stalled, which stall_after reports")


def a_name(value: Any) -> bool:
    """Whether ``value`` can be an Airflow connection's or pool's id."""
    return isinstance(value, str) and 0 < len(value) <= 250 and all(
        c.isascii() and (c.isalnum() or c in "_-.") for c in value)


def check_settings(*, retries: Any, defer_after: Any, retry_delay: Any, commit_timeout: Any, plan_timeout: Any,
                    deferrable: Any, emit_assets: Any, tags: Any, spark_connect_conn_id: Any,
                    spark_conf: Mapping[str, Any] | None, kubernetes_dsn_secret: str | None) -> None:
    """Refuse a task setting of :func:`transactional_dag` that Airflow would take and fail on later."""
    if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= 100:
        raise ConfigError(f"retries must be an integer from 0 to 100, got {retries!r}")
    if not isinstance(defer_after, timedelta) or defer_after < timedelta(0):
        raise ConfigError(f"defer_after must be a timedelta of 0 or more (e.g. timedelta(seconds=10)), "
                          f"got {defer_after!r}")
    for name, value in (("retry_delay", retry_delay), ("commit_timeout", commit_timeout),
                        ("plan_timeout", plan_timeout)):
        if not isinstance(value, timedelta) or value <= timedelta(0):
            raise ConfigError(f"{name} must be a positive timedelta (e.g. timedelta(minutes=5)), got {value!r}")
    for flag, on in (("deferrable", deferrable), ("emit_assets", emit_assets)):
        if not isinstance(on, bool):
            raise ConfigError(f"{flag} must be True or False, got {on!r}")
    if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
        raise ConfigError(f"tags must be a list of strings (e.g. tags=['billing']), got {tags!r}")
    check_spark_connect(spark_connect_conn_id, spark_conf)
    check_no_secret_on_argv(spark_conf or {})
    if kubernetes_dsn_secret is not None:
        check_kubernetes_secret(kubernetes_dsn_secret)


def check_spark_connect(conn_id: Any, spark_conf: Mapping[str, Any] | None) -> None:
    """A Spark Connect connection id is a name, and the settings of Spark belong to its server."""
    if conn_id is None:
        return
    if not a_name(conn_id):
        raise ConfigError(f"spark_connect_conn_id must name a spark_connect connection (letters, digits, '_', '-', "
                          f"'.', e.g. 'spark_connect_default'), got {conn_id!r}")
    if spark_conf:
        raise ConfigError(f"spark_conf does not reach a Spark Connect server (spark_connect_conn_id={conn_id!r}): "
                          "set those settings where the server is started, and drop spark_conf here")


def check_late_commit(callback: Callable[..., Any] | str) -> None:
    """A deadline callback must be importable and a coroutine function: checked now, not when it fires."""
    target = imported(callback, setting="on_late_commit", kind="an async function", where="the triggerer runs")
    if not inspect.iscoroutinefunction(target):
        raise ConfigError(f"on_late_commit must be a coroutine function (async def) or its dotted path, "
                          f"got {callback!r}")


def check_verify(verify: Any, pool: Any, lag: Any = 0, conn_id: Any = None) -> None:
    """``verify`` is a round, ``"N"`` or ``"N:K"``; ``verify_pool`` a pool's name; ``verify_lag``
    a whole number below N; ``verify_conn_id`` a connection's name."""
    if verify is None:
        for name, value, unset in (("verify_pool", pool, None), ("verify_lag", lag, 0),
                                   ("verify_conn_id", conn_id, None)):
            if value != unset:
                raise ConfigError(f"{name} needs verify: say how many txids a round checks (e.g. verify=\"10\")")
        return
    budget = Round.parse(verify, "verify").budget
    if isinstance(lag, bool) or not isinstance(lag, int) or not 0 <= lag < budget:
        raise ConfigError(f"verify_lag is how many txids to recompute a round may leave to a later one: a whole "
                          f"number from 0 to {budget - 1} (below the round's {budget}), got {lag!r}")
    if pool is not None and not a_name(pool):
        raise ConfigError(f"verify_pool must name an Airflow pool (letters, digits, '_', '-', '.'), got {pool!r}")
    if conn_id is not None and not a_name(conn_id):
        raise ConfigError(f"verify_conn_id must name an Airflow connection (letters, digits, '_', '-', '.'): the "
                          f"auditor role's (docs/guides/security.md), got {conn_id!r}")
