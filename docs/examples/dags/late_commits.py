"""A topology with a commit deadline, as the observability guide declares one: a run not committed
within ten minutes of being queued calls ``my_alerts.page_late_commit`` in the triggerer."""

from datetime import timedelta

from airflow_transactional import PostgresLogSource, StateSpec, transactional_dag

# --8<-- [start:dag]
words = transactional_dag(
    "words",
    source=PostgresLogSource("tweets"),
    states=[StateSpec("url_counts", keys={"url": "text"}, combiner="count")],
    application="../spark_jobs/words.py",
    schedule="* * * * *",
    commit_deadline=timedelta(minutes=10),
    on_late_commit="my_alerts.page_late_commit",
)
# --8<-- [end:dag]
