"""The stall watch over every topology of the state store: every five minutes it checks each one's
stall rule (no commit for its ``stall_after`` while its source holds records), sends the gauges
``transactional.<topology>.stalled`` and ``stall_seconds``, and logs what a stalled topology's next
txid waits for. Give ``on_stall`` (a function or its dotted path) to be called once per stall."""

from __future__ import annotations

import os

from airflow_transactional import stall_watch_dag

dag = stall_watch_dag(
    schedule=os.environ.get("AIRFLOW_TXN_STALL_WATCH_SCHEDULE") or "*/5 * * * *",
    on_stall=os.environ.get("AIRFLOW_TXN_ON_STALL") or None,
)
