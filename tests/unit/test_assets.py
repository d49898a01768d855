"""airflow/assets.py: a commit's asset events name the tables it updated -- not the table of a
state the DAG file adds, which has no table and no value until it is built and switched in."""

from __future__ import annotations

from airflow_transactional.airflow.assets import committed_outlets, topology_assets
from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spec import OutputSpec, StateSpec, TopologySpec

COUNTS = StateSpec("counts", {"k": "text"})
ADDED = StateSpec("totals", {"k": "text"})


def test_a_commit_sends_no_event_for_a_state_declared_or_building_and_one_once_it_is_live() -> None:
    source, out = PostgresLogSource("events"), [OutputSpec("out", log="out_log")]
    in_dag_file = TopologySpec("t", source, [COUNTS, ADDED], outputs=out)
    outlets = topology_assets(in_dag_file)  # what the DAG's commit task declares
    for stage in ("declared", "building"):
        stored = TopologySpec("t", source, [COUNTS], outputs=out, **{stage: [ADDED]})
        assert [str(o.uri) for o in committed_outlets(outlets, stored)] == [
            "transactional://t/counts", "transactional://t/log/out_log"]
    assert committed_outlets(outlets, in_dag_file) == outlets
