"""The stall watch of the observability guide, paging through ``my_alerts.page_on_call``."""

from airflow_transactional import stall_watch_dag

# --8<-- [start:dag]
dag = stall_watch_dag(schedule="*/5 * * * *", on_stall="my_alerts.page_on_call")
# --8<-- [end:dag]
