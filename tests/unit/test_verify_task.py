"""The verify task at parse time: a round of the shadow audit after the commit, in a pool of its
own at the lowest priority, running the topology's own job on a verify round's request; a bad round or
pool refused naming the fix."""

from __future__ import annotations

import json
import subprocess

import pytest

from airflow_transactional.exceptions import ConfigError
from tests.unit.test_dag_api import WORDS_JOB, _dag, _no_database  # noqa: F401 -- parse time touches no database

pytestmark = pytest.mark.unit


def test_a_verify_task_checks_after_the_commit_in_a_pool_of_its_own_last_in_line() -> None:
    dag = _dag(spark_pool="spark", verify="5:2", verify_pool="audit", spark_conf={"spark.executor.memory": "2g"})
    commit, verify = dag.get_task("commit"), dag.get_task("verify")
    assert commit.downstream_task_ids == {"verify"} and verify.trigger_rule == "all_success"
    assert verify.pool == "audit" and dag.get_task("process").pool == "spark"
    assert verify.priority_weight == 1 and verify.weight_rule == "absolute"
    assert verify.retries == 2  # a killed job is tried again; a failed check fails at once (AirflowFailException)
    assert verify.application == WORDS_JOB and verify.conf == {"spark.executor.memory": "2g"}
    assert verify.verify_round == "5:2"  # the round's request, written when a round has txids to recompute
    assert verify.job_args(7, "airflow_txn") == ["--topology", "t_words", "--schema", "airflow_txn"]
    assert verify.verify_lag == 0 and _dag(verify="5", verify_lag=4).get_task("verify").verify_lag == 4
    assert "verify" not in _dag().task_ids
    # With an auditor's connection the verify task alone connects with it; the others as before.
    audited = _dag(verify="5", verify_conn_id="txn_auditor")
    assert {t.task_id: t.transactional_conn_id for t in audited.tasks} == {
        "plan": "transactional_default", "process": "transactional_default", "commit": "transactional_default",
        "verify": "txn_auditor"}
    assert verify.transactional_conn_id == "transactional_default"


@pytest.mark.parametrize(("overrides", "fix"), [
    ({"verify": "all"}, 'verify is a round of the shadow audit, "N" or "N:K"'),
    ({"verify": "10:0"}, "verify is a round of the shadow audit"),
    ({"verify": 10}, "verify is a round of the shadow audit"),
    ({"verify_pool": "audit"}, "verify_pool needs verify"),
    ({"verify_lag": 2}, "verify_lag needs verify"),
    ({"verify": "10", "verify_lag": 10}, r"verify_lag is how many txids .* from 0 to 9 \(below the round's 10\)"),
    ({"verify": "10", "verify_lag": -1}, "verify_lag is how many txids"),
    ({"verify": "10:2", "verify_lag": 9, "verify_pool": "audit"}, None),
    ({"verify": "10", "verify_pool": "a pool"}, "verify_pool must name an Airflow pool"),
    ({"verify_conn_id": "txn_auditor"}, "verify_conn_id needs verify"),
    ({"verify": "10", "verify_conn_id": "an auditor"}, "verify_conn_id must name an Airflow connection"),
    ({"verify": "10:5", "verify_pool": "audit"}, None),
])
def test_a_bad_round_or_pool_is_refused_at_parse_time_naming_the_fix(overrides: dict[str, object],
                                                                      fix: str | None) -> None:
    if fix is None:  # the control: a good declaration of the same shape is accepted
        _dag(**overrides)
        return
    with pytest.raises(ConfigError, match=fix):
        _dag(**overrides)


def test_the_verify_job_s_spark_submit_starts_at_the_lowest_cpu_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_transactional.spark.submit import VERIFY_NICENESS, lowest_priority

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    started: dict[str, object] = {}
    monkeypatch.setattr(SparkSubmitHook, "submit", lambda self, application="", **kwargs: started.update(kwargs))
    dag = _dag(verify="5", spark_conn_id="spark_test")
    dag.get_task("verify")._get_hook().submit("job.py")
    assert started["preexec_fn"] is lowest_priority
    started.clear()
    dag.get_task("process")._get_hook().submit("job.py")  # the processing keeps its priority
    assert "preexec_fn" not in started
    niced = subprocess.run(["nice"], preexec_fn=lowest_priority, capture_output=True, text=True, check=True)
    assert int(niced.stdout) == VERIFY_NICENESS
