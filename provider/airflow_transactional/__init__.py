"""Exactly-once, strictly ordered batch commits for Airflow + Spark, state in PostgreSQL."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def get_provider_info() -> dict[str, Any]:
    """Describe this provider to Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""
    return {
        "package-name": "airflow-provider-transactional",
        "name": "Transactional",
        "description": "Exactly-once, strictly ordered batch commits for Spark pipelines, "
        "with the transaction state in PostgreSQL.",
        "versions": [__version__],
    }
