"""The Airflow plugin that puts the Transactions views in the UI: registered through the
``airflow.plugins`` entry point, so installing the provider is enough.

- in the navigation, **Transactions**: every topology the user may see;
- on each DAG's page, a **Transactions** tab: the topology's timeline and commit log;
- on each DAG run's page, a **Transaction** tab: that run's txid, batch, attempts, commit and
  quarantined records.

The pages are served by the plugin's own FastAPI app (:mod:`.app`), mounted at ``/transactional``.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

# Imported here for what Airflow forks: the scheduler loads plugins before its LocalExecutor forks
# the workers each task process is a fork of, so a task finds the operators (and the Spark
# provider and OpenLineage modules under them) imported already -- 0.3 CPU-s less per task.
from .. import operators  # noqa: F401
from ..priority import TransactionalPriority
from .app import PREFIX
from .server import create_app


class TransactionalPlugin(AirflowPlugin):
    name = "transactional"
    # The weight rule of every topology's tasks (see airflow/priority.py): Airflow loads it by name.
    priority_weight_strategies = [TransactionalPriority]
    fastapi_apps = [{"app": create_app(), "url_prefix": PREFIX, "name": "Transactional"}]
    external_views = [
        {"name": "Transactions", "href": f"{PREFIX}/", "destination": "nav", "url_route": "transactions",
         "category": "browse"},
        {"name": "Transactions", "href": f"{PREFIX}/dags/{{DAG_ID}}", "destination": "dag",
         "url_route": "transactions-dag"},
        {"name": "Transaction", "href": f"{PREFIX}/dags/{{DAG_ID}}/runs/{{RUN_ID}}", "destination": "dag_run",
         "url_route": "transactions-run"},
    ]
