"""Three tasks that do nothing, shaped like a transaction (plan >> process >> commit): what
Airflow itself costs per run, the floor under every transaction (``bench.perf``): ``bench_noop``
one run at a time (the ``overhead`` section), ``bench_scale_noop`` three (the ``scale`` section's
plain DAG, at its topologies' ``max_in_flight``)."""

from datetime import datetime

from airflow.sdk import DAG, task

for dag_id, runs in (("bench_noop", 1), ("bench_scale_noop", 3)):
    with DAG(dag_id, schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=runs) as dag:
        @task
        def plan() -> None:
            return None

        @task
        def process() -> None:
            return None

        @task
        def commit() -> None:
            return None

        plan() >> process() >> commit()
    globals()[dag_id] = dag
