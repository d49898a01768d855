"""The verify task at parse time: a round of the shadow audit after the commit, in a pool of its
own at the lowest priority, running the topology's own job in its --verify mode; a bad round or
pool refused naming the fix."""

from __future__ import annotations

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
    assert verify.job_args(7, "airflow_txn") == ["--topology", "t_words", "--verify", "5:2", "--schema", "airflow_txn"]
    assert "verify" not in _dag().task_ids


@pytest.mark.parametrize(("overrides", "fix"), [
    ({"verify": "all"}, 'verify is a round of the shadow audit, "N" or "N:K"'),
    ({"verify": "10:0"}, "verify is a round of the shadow audit"),
    ({"verify": 10}, "verify is a round of the shadow audit"),
    ({"verify_pool": "audit"}, "verify_pool needs verify"),
    ({"verify": "10", "verify_pool": "a pool"}, "verify_pool must name an Airflow pool"),
    ({"verify": "10:5", "verify_pool": "audit"}, None),
])
def test_a_bad_round_or_pool_is_refused_at_parse_time_naming_the_fix(overrides: dict[str, object],
                                                                      fix: str | None) -> None:
    if fix is None:  # the control: a good declaration of the same shape is accepted
        _dag(**overrides)
        return
    with pytest.raises(ConfigError, match=fix):
        _dag(**overrides)
