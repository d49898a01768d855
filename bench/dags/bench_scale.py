"""What one scheduler carries (``bench.perf``, section ``scale``): topologies whose logs stay
empty, so every transaction is Airflow's and the state store's work alone (the process task skips
an empty batch without a Spark job); the same three tasks doing nothing as a plain DAG, at the
same ``max_active_runs``, are ``bench_noop.py``'s ``bench_scale_noop``."""

from pathlib import Path

from airflow_transactional import PostgresLogSource, StateSpec, transactional_dag

REPO = Path(__file__).resolve().parents[2]
#: The most topologies a run of the section measures at once (``Sizes.scale_topologies``).
TOPOLOGIES = 4
MAX_IN_FLIGHT = 3

for i in range(TOPOLOGIES):
    globals()[f"bench_scale_{i}"] = transactional_dag(
        f"bench_scale_{i}", source=PostgresLogSource(f"bench_scale_{i}"),
        states=[StateSpec("c", keys={"k": "text"}, combiner="count", table=f"bench_scale_{i}")],
        application=str(REPO / "spark_jobs" / "words.py"), schedule="@daily", max_in_flight=MAX_IN_FLIGHT)
