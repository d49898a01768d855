"""Three tasks that do nothing, shaped like a transaction (plan >> process >> commit): what
Airflow itself costs per run, the floor under every transaction (``bench.perf``)."""

from datetime import datetime

from airflow.sdk import DAG, task

with DAG("bench_noop", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=1):
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
