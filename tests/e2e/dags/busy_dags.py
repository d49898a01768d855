"""Five topologies on the stack's two-slot ``spark`` pool, for the liveness test
(``test_liveness.py``): three first stages that keep the pool saturated with dated runs, and two
second stages started by ``busy_0``'s commits (asset-triggered runs, which have no logical date).
``busy_after`` is declared as any topology is; ``busy_after_fifo`` is the same with Airflow's own
``upstream`` weight rule put back, to show the starvation the provider's weight rule prevents.
Their batches run on the stack's Spark Connect server. Deployed into the test stack's DAGs folder
as a symlink."""

import os
from datetime import timedelta
from pathlib import Path

from airflow.sdk import PartitionedAssetTimetable

from airflow_transactional import PostgresLogSource, StateSpec, state_asset, transactional_dag

REPO = Path(__file__).resolve().parents[3]  # the symlink's target: tests/e2e/dags/ of the repository
FIRST = [f"busy_{k}" for k in range(3)]
SECOND = ["busy_after", "busy_after_fifo"]


def _topology(name: str, schedule: object, in_flight: int = 4, **more: object) -> object:
    return transactional_dag(
        name,
        source=PostgresLogSource(name.replace("_", "")),
        states=[StateSpec("global_count", keys={"id": "text"}, combiner="count", table=name)],
        application=str(REPO / "spark_jobs" / "global_count.py"),
        schedule=schedule,
        max_in_flight=in_flight,
        max_batch_size=10,
        spark_connect_conn_id="spark_connect_default",
        spark_pool="spark",
        **more,  # type: ignore[arg-type]
    )


for _name in FIRST:
    globals()[_name] = _topology(_name, os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "@daily")
# A run per busy_0 commit (its state asset's events carry the txid as partition key). The starved
# one stalls (no commit for 8 s with records waiting) and misses its commit deadline (15 s after
# its run was queued) while it waits for the pool.
busy_after = _topology("busy_after", PartitionedAssetTimetable(assets=state_asset("busy_0", "busy_0")), 1)
busy_after_fifo = _topology("busy_after_fifo", PartitionedAssetTimetable(assets=state_asset("busy_0", "busy_0")), 1,
                            stall_after=timedelta(seconds=8), commit_deadline=timedelta(seconds=15))
for _task in busy_after_fifo.tasks:  # type: ignore[attr-defined]
    _task.weight_rule = "upstream"  # Airflow's own rule: asset-triggered runs sort after every dated run
