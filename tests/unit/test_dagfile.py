"""What the owner's commands read a DAG file for: the topologies it declares, found among its
globals the way the dag-processor finds DAGs, whatever else the file imports."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_transactional.airflow.dagfile import declared_as_stored, declared_topologies
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.spec import TopologySpec

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dag_file, topologies", [
    ("tests/e2e/dags/ops_dags.py", {"ops_count", "ops_killed", "ops_deleted", "ops_opaque"}),  # imports DAG too
    ("dags/words.py", {"words"}),
    ("dags/payments.py", {"payments", "settlement"}),
])
def test_every_topology_a_dag_file_declares_is_found(dag_file: str, topologies: set[str]) -> None:
    found = {spec.topology_id for spec in declared_topologies([str(REPO / dag_file)])}
    assert topologies <= found


def test_a_file_that_declares_none_is_refused_naming_it(tmp_path: Path) -> None:
    plain = tmp_path / "plain.py"
    plain.write_text("from airflow.sdk import DAG\nfrom datetime import datetime\n"
                     "dag = DAG('plain', schedule=None, start_date=datetime(2025, 1, 1))\n")
    with pytest.raises(ConfigError, match="declares no transactional topology"):
        declared_topologies([str(plain)])


def test_the_stored_declaration_may_differ_in_batch_tuning_only() -> None:
    """An example DAG reads its batch size and schedule (so its stall rule) from the environment,
    which the owner's shell need not share with the scheduler's: that is no reason to refuse; what
    the job runs is."""
    words = str(REPO / "dags" / "words.py")
    [declared] = [s for s in declared_topologies([words]) if s.topology_id == "words"]
    config = declared.to_config()
    tuned = TopologySpec.from_config({**config, "max_batch_size": 400, "max_in_flight": 9,
                                      "stall_after_seconds": 864000})  # @daily's
    assert declared_as_stored(tuned, words, "audit").to_config() == config
    moved = TopologySpec.from_config({**config, "job": {**config["job"], "application": "/tmp/another.py"}})
    with pytest.raises(ConfigError, match=r"differs from .*words.py's \(job\)"):
        declared_as_stored(moved, words, "audit")
