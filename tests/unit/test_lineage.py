"""What the tasks tell OpenLineage (``lineage.py``): dataset names that join the stages of a
pipeline, the state store's namespace without its credentials, and an ``OperatorLineage`` whose
run facet carries the transaction."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from airflow_transactional import DecisionSpec, OutputSpec, StateSpec, TopologySpec
from airflow_transactional.airflow.lineage import RUN_FACET, dataset_names, operator_lineage, store_namespace
from airflow_transactional.sources import LandingDirectory, PostgresLogSource

pytestmark = pytest.mark.unit

PAYMENTS = TopologySpec("payments", PostgresLogSource("payment_requests"),
                        [StateSpec("debits", {"account": "text"}),
                         StateSpec("seen", {"account": "text"}, table="audit.requests_seen")],
                        decisions=[DecisionSpec("pay", state="debits", floor=-100)],
                        outputs=[OutputSpec("ledger", partitions=4)])
SETTLEMENT = TopologySpec("settlement", PostgresLogSource("ledger"), [StateSpec("credits", {"account": "text"})])


def test_stage_one_output_log_and_stage_two_source_are_one_dataset() -> None:
    source, outputs = dataset_names(PAYMENTS, "airflow_txn", "bank")
    assert source == ("postgres", "bank.airflow_txn.log.payment_requests")
    assert outputs == [("state", "debits", "bank.public.debits"), ("state", "seen", "bank.audit.requests_seen"),
                       ("log", "ledger", "bank.airflow_txn.log.ledger")]
    downstream, _ = dataset_names(SETTLEMENT, "airflow_txn", "bank")
    assert downstream == ("postgres", outputs[-1][2])


def test_a_landing_directory_is_its_path_and_a_log_in_its_own_schema_keeps_it(tmp_path: object) -> None:
    landing = TopologySpec("files", LandingDirectory("/data/in"), [StateSpec("n", {"k": "text"})])
    assert dataset_names(landing, "airflow_txn", "db")[0] == ("file", "/data/in")
    on_s3 = TopologySpec("files", LandingDirectory("s3a://landing/in/clicks"), [StateSpec("n", {"k": "text"})])
    assert dataset_names(on_s3, "airflow_txn", "db")[0] == ("s3://landing", "in/clicks")  # OpenLineage's naming
    on_hdfs = TopologySpec("files", LandingDirectory("hdfs://nn:8020/landing/in"), [StateSpec("n", {"k": "text"})])
    assert dataset_names(on_hdfs, "airflow_txn", "db")[0] == ("hdfs://nn:8020", "/landing/in")
    other = TopologySpec("x", PostgresLogSource("events", schema="ingest"), [StateSpec("n", {"k": "text"})])
    assert dataset_names(other, "airflow_txn", "db")[0] == ("postgres", "db.ingest.log.events")


@pytest.mark.parametrize(("dsn", "expected"), [
    ("postgresql://txn:s3cret@db.example.com:6543/prod?sslmode=require", ("postgres://db.example.com:6543", "prod")),
    ("host=/var/run/postgresql port=5433 dbname=state user=txn", ("postgres://localhost:5433", "state")),
    ("host=pg user=txn password=s3cret", ("postgres://pg:5432", "postgres")),
])
def test_the_namespace_names_the_server_and_never_its_credentials(dsn: str, expected: tuple[str, str]) -> None:
    got = store_namespace(dsn)
    assert got == expected and "s3cret" not in repr(got) and "txn" not in got[0]


def test_the_commit_reports_inputs_outputs_row_counts_and_the_transaction() -> None:
    from openlineage.client.serde import Serde

    txn = SimpleNamespace(txid=7, start_offsets={"0": 10}, end_offsets={"0": 25}, planned_records=15)
    commit = {"attempt": 2, "row_counts": {"debits": 4, "ledger": 9}}
    dsn = "postgresql://txn:s3cret@db.example.com:5432/bank"
    got = operator_lineage(PAYMENTS.to_config(), dsn, "airflow_txn", txn, commit, writes=True)
    assert [(d.namespace, d.name) for d in got.inputs] == [("postgres://db.example.com:5432",
                                                            "bank.airflow_txn.log.payment_requests")]
    assert [d.name for d in got.outputs] == ["bank.public.debits", "bank.audit.requests_seen",
                                             "bank.airflow_txn.log.ledger"]
    stats = [json.loads(Serde.to_json(d))["outputFacets"].get("outputStatistics", {}).get("rowCount")
             for d in got.outputs]
    assert stats == [4, None, 9]  # requests_seen wrote nothing this txid
    facet = json.loads(Serde.to_json(got.run_facets[RUN_FACET]))
    assert {k: facet[k] for k in ("topology", "txid", "attempt", "startOffsets", "endOffsets", "records",
                                  "committed")} == {"topology": "payments", "txid": 7, "attempt": 2,
                                                    "startOffsets": {"0": 10}, "endOffsets": {"0": 25},
                                                    "records": 15, "committed": True}
    assert facet["_producer"] and facet["_schemaURL"]
    reader = operator_lineage(PAYMENTS.to_config(), dsn, "airflow_txn", txn, None, writes=False)
    assert reader.outputs == [] and len(reader.inputs) == 1
    assert json.loads(Serde.to_json(reader.run_facets[RUN_FACET]))["committed"] is False
    assert "s3cret" not in Serde.to_json(got.run_facets[RUN_FACET]) + repr(got.inputs) + repr(got.outputs)
