"""A topology whose runs find nothing to do: what an empty transaction costs (``bench.perf``)."""

from pathlib import Path

from airflow_transactional import PostgresLogSource, StateSpec, transactional_dag

REPO = Path(__file__).resolve().parents[2]

dag = transactional_dag("bench_empty", source=PostgresLogSource("bench_empty"),
                        states=[StateSpec("c", keys={"k": "text"}, combiner="count", table="bench_empty")],
                        application=str(REPO / "spark_jobs" / "words.py"), schedule="@daily", max_in_flight=1)
