"""Exactly-once, strictly ordered batch commits for Airflow + Spark, state in PostgreSQL."""

from __future__ import annotations

from typing import Any

from .connections import store_dsn
from .processing import OutputEvent, Request
from .sources import EventLog, KafkaSource, LandingDirectory, PostgresLogSource
from .spark.submit import LOCAL_SPARK_CONF, spark_backend
from .spec import DecisionSpec, OutputSpec, SparkJob, StateSpec, TopologySpec

__version__ = "0.1.0"

__all__ = ["LOCAL_SPARK_CONF", "DecisionSpec", "EventLog", "KafkaSource", "LandingDirectory", "OutputEvent",
           "OutputSpec", "PostgresLogSource", "Request", "SparkJob", "StateSpec", "TopologySpec", "get_provider_info",
           "output_asset", "spark_backend", "stall_watch_dag", "state_asset", "store_dsn", "transactional_dag"]


def __getattr__(name: str) -> Any:
    # The DAG API imports Airflow; the core (and provider discovery) must not pay for that.
    if name == "transactional_dag":
        from .airflow.dag import transactional_dag

        return transactional_dag
    if name in ("state_asset", "output_asset"):
        from .airflow import assets

        return getattr(assets, name)
    if name == "stall_watch_dag":
        from .airflow.stalls import stall_watch_dag

        return stall_watch_dag
    raise AttributeError(name)


# The connection form of the Airflow UI. Airflow 3.3 builds that form from the provider info
# alone (it does not import the hook), so the hook reads these same values.
CONNECTION_TYPE = "transactional"
HOOK_NAME = "Transactional state store (PostgreSQL)"
UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden_fields": [],
    "relabeling": {"schema": "Database"},
    "placeholders": {
        "host": "postgres.example.internal",
        "port": "5432",
        "schema": "analytics",
        "login": "txn_app",
        "extra": '{"state_schema": "airflow_txn", "sslmode": "require"}',
    },
}


def get_provider_info() -> dict[str, Any]:
    """Describe this provider to Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""
    return {
        "package-name": "airflow-provider-transactional",
        "name": "Transactional",
        "description": "Exactly-once, strictly ordered batch commits for Spark pipelines, "
        "with the transaction state in PostgreSQL.",
        "versions": [__version__],
        "integrations": [{
            "integration-name": "Transactional",
            "external-doc-url": "https://pypi.org/project/airflow-provider-transactional/",
            "tags": ["software"],
        }],
        "operators": [{
            "integration-name": "Transactional",
            "python-modules": ["airflow_transactional.airflow.operators"],
        }],
        "triggers": [{
            "integration-name": "Transactional",
            "python-modules": ["airflow_transactional.airflow.triggers"],
        }],
        "hooks": [{
            "integration-name": "Transactional",
            "python-modules": ["airflow_transactional.airflow.hooks"],
        }],
        "connection-types": [{
            "connection-type": CONNECTION_TYPE,
            "hook-class-name": "airflow_transactional.airflow.hooks.TransactionalHook",
            "hook-name": HOOK_NAME,
            "ui-field-behaviour": {key.replace("_", "-"): value for key, value in UI_FIELD_BEHAVIOUR.items()},
        }],
    }
