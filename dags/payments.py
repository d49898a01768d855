"""Payments in two stages, after "Online Event Processing" (Figure 3): exactly once end to end.

``payments`` reads payment requests (log ``payment_requests``, partitioned by payer), validates
them in Spark, and decides them in its commit, one by one per payer in log order: a payment is
granted only while the payer's balance -- credits settled so far plus debits granted so far --
stays at or above the overdraft limit. The same commit appends the granted payments' ledger
events (outgoing, incoming, fee) or the declined event to log ``ledger``.

``settlement`` reads ``ledger`` (and the deposits the bank appends to it) and keeps each
account's ``credits`` and ``statements``. It runs when ``payments`` commits (its asset) and on
its own interval (backfills need one); it still commits strictly in txid order.
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable, DeltaTriggerTimetable

from airflow_transactional import (
          DecisionSpec,
          OutputSpec,
          PostgresLogSource,
          StateSpec,
          output_asset,
          spark_backend,
          transactional_dag,
)

# Every minute on the minute (cron): a run's logical date is a whole minute, so Airflow's Backfill
# dialog over a failed minute finds that very run (a timedelta would start from the unpause time).
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "* * * * *"
OVERDRAFT = 100  # no account goes below -OVERDRAFT, at any commit
LEDGER_PARTITIONS = 4
common = {"max_in_flight": 3, **spark_backend(), "spark_pool": os.environ.get("AIRFLOW_TXN_SPARK_POOL"),
          "max_batch_size": int(os.environ.get("AIRFLOW_TXN_EXAMPLE_BATCH", "20000"))}

payments = transactional_dag(
    "payments",
    source=PostgresLogSource("payment_requests"),
    states=[StateSpec("debits", keys={"account": "text"}),
            StateSpec("requests_seen", keys={"account": "text"}, combiner="count")],
    decisions=[DecisionSpec("pay", state="debits", floor=-OVERDRAFT, headroom="public.credits")],
    # --8<-- [start:kafka-output]
    # The decisions also go to a Kafka topic when one is named (the demo's `ledger`): each txid's
    # ledger events in one Kafka transaction, for plain consumers at read_committed.
    outputs=[OutputSpec("ledger", partitions=LEDGER_PARTITIONS,
                        kafka_topic=os.environ.get("AIRFLOW_TXN_PAYMENTS_KAFKA_TOPIC") or None)],
    # --8<-- [end:kafka-output]
    application="../spark_jobs/payments.py",
    schedule=SCHEDULE,
    **common,
)

settlement = transactional_dag(
    "settlement",
    source=PostgresLogSource("ledger"),
    states=[StateSpec("credits", keys={"account": "text"}),
            StateSpec("statements", keys={"account": "text", "request": "text", "type": "text"})],
    application="../spark_jobs/settlement.py",
    schedule=AssetOrTimeSchedule(
        timetable=DeltaTriggerTimetable(SCHEDULE) if isinstance(SCHEDULE, timedelta)
        else CronTriggerTimetable(SCHEDULE, timezone="UTC"),
        assets=output_asset("payments", "ledger")),
    **common,
)
