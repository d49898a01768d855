"""Six small topologies for the deferred-waits test (``test_deferred_waits.py``): each on its own
(empty) log, three transactions in flight, one retry after a short delay. Their batches are empty,
so no ``spark-submit`` runs: what is measured is where the plans and commits wait -- their plan tasks
leave every empty batch to its commit task (``commit_empty``), which would otherwise commit it
at once when its turn has come. Deployed into the test stack's DAGs folder as a symlink."""

import os
from datetime import timedelta
from pathlib import Path

from airflow_transactional import PostgresLogSource, StateSpec, transactional_dag

# The test stack sets a daily schedule that does not fire while the suite runs.
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "@daily"

REPO = Path(__file__).resolve().parents[3]  # the symlink's target: tests/e2e/dags/ of the repository
SLOTS = [f"slots_{k}" for k in range(6)]

for name in SLOTS:
    globals()[name] = transactional_dag(
        name,
        source=PostgresLogSource(name.replace("_", "")),
        states=[StateSpec("global_count", keys={"id": "text"}, combiner="count", table=name)],
        application=str(REPO / "spark_jobs" / "global_count.py"),
        schedule=SCHEDULE,
        max_in_flight=3,
        retries=1,
        # The waiting commits of txids 3 and 4 defer after 2 s, and txid 2's retry comes 40 s after
        # its failure: time for all twelve to start and defer even on a loaded machine (with 10 s
        # and 15 s, a run beside two other lanes saw two deferred at once, not twelve).
        defer_after=timedelta(seconds=2),
        retry_delay=timedelta(seconds=40),
        # slots_0 promises its commits within 5 s of a run being queued, which txid 2's retry
        # (40 s later) cannot keep: Airflow's deadline alert calls the late-commit callback.
        commit_deadline=timedelta(seconds=5) if name == "slots_0" else None,
    )
    globals()[name].get_task("plan").commit_empty = False
