"""Where ``airflow-txn audit|rebuild|correct|verify`` run the topology's job: a spark-submit driver
on ``--master``, or a client of the Spark Connect server of an Airflow connection -- its URL and
token from the connection, never from argv."""

from __future__ import annotations

import json

import pytest

from airflow_transactional.cli.args import on_spark
from airflow_transactional.cli.main import parser
from airflow_transactional.coordinator import Audit
from airflow_transactional.exceptions import ConfigError, TransactionalError
from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spark.recompute import client_path, connect_client_env, recompute
from airflow_transactional.spec import SparkJob, StateSpec, TopologySpec


def _args(*argv: str):
    return parser().parse_args(["audit", "words", *argv])


def test_a_spark_connect_connection_gives_its_url_with_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_MY_SPARK", json.dumps(
        {"conn_type": "spark_connect", "host": "sc://spark.internal", "port": 15002, "password": "s3cret"}))
    where = on_spark(_args("--spark-connect", "my_spark"))
    assert where["remote"] == "sc://spark.internal:15002/;token=s3cret"
    assert on_spark(_args())["remote"] is None and on_spark(_args())["master"] == "local[2]"


def test_a_url_or_an_unknown_connection_is_refused_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"an Airflow connection id, not a URL \(a URL's token shows in ps\)"):
        on_spark(_args("--spark-connect", "sc://host:15002/;token=x"))
    monkeypatch.delenv("AIRFLOW_CONN_NOSUCH", raising=False)
    with pytest.raises(ConfigError, match=r"no Spark Connect server from the Airflow connection 'nosuch'.*"
                                          r"conn_type spark_connect"):
        on_spark(_args("--spark-connect", "nosuch"))


def test_conf_for_a_connect_server_is_refused_before_anything_runs() -> None:
    spec = TopologySpec("words", PostgresLogSource("tweets"), [StateSpec("url_counts", {"url": "text"})],
                        job=SparkJob("/jobs/words.py"))
    with pytest.raises(TransactionalError, match="a Spark Connect server has its own settings"):
        recompute("postgresql://x@nowhere/db", "airflow_txn", spec, Audit("words"), master="local[2]",
                  conf=["spark.executor.memory=4g"], remote="sc://localhost:15002/;token=t")


def test_a_clients_environment_holds_the_url_and_the_dsn_and_its_modules_path() -> None:
    env = connect_client_env("sc://h:1/;token=t", "postgresql://u:pw@h/db", None, "/lib/a.zip,/jobs/x.py",
                             {"PYTHONPATH": "/mine"})
    assert env["SPARK_REMOTE"] == "sc://h:1/;token=t"
    assert "postgresql://u:pw@h/db" in env["AIRFLOW_TXN_DSN"]
    assert env["PYTHONPATH"] == "/lib/a.zip:/jobs:/mine"
    assert client_path("/lib/a.zip,/jobs/x.py,/jobs/y.py,s3://b/z.py") == ["/lib/a.zip", "/jobs"]
