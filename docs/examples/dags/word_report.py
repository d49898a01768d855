"""A DAG downstream of a topology, as the observability guide declares one: one run per txid that
``words`` commits into ``word_counts`` (the asset event's partition key is the txid)."""

from datetime import datetime

# --8<-- [start:dag]
from airflow.sdk import DAG, PartitionedAssetTimetable, task

from airflow_transactional import state_asset

with DAG("word_report", schedule=PartitionedAssetTimetable(assets=state_asset("words", "word_counts")),
         start_date=datetime(2026, 1, 1)):

    @task
    def report(**context):
        [event] = [e for events in context["triggering_asset_events"].values() for e in events]
        print(f"txid {event.extra['txid']}: {event.extra['records_read']} records")

    report()
# --8<-- [end:dag]
