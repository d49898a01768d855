"""Per-user order totals from JSON-lines files landing in an S3 bucket, in arrival order, each
file pinned by its ETag: an overwrite is a new version, counted in a later txid
(docs/guides/object-storage.md). ``make demo`` runs it on the S3 server it starts."""

from __future__ import annotations

import os

# --8<-- [start:imports]
from airflow_transactional import LandingDirectory, StateSpec, spark_backend, transactional_dag

# --8<-- [end:imports]

S3_LANDING = os.environ.get("AIRFLOW_TXN_S3_LANDING") or "s3a://demo-landing/orders"
# The batch-emit interval (the end-to-end tests set a daily one and trigger runs over REST).
SCHEDULE = os.environ.get("AIRFLOW_TXN_EXAMPLE_SCHEDULE") or "* * * * *"

# --8<-- [start:dag]
dag = transactional_dag(
    "s3_orders",
    # An S3 prefix, read with Hadoop's s3a; the bucket's credentials and endpoint come from the
    # Airflow connection aws_default (type aws). Each plan lists the prefix, so an overwrite is seen
    # at once; for a prefix of many timestamped names, listing="incremental" lists only the new ones.
    source=LandingDirectory(S3_LANDING, format="json", pattern="*.json", max_files=20, conn_id="aws_default"),
    states=[
        StateSpec("s3_order_totals", keys={"user": "text"}, combiner="sum"),
        StateSpec("s3_order_counts", keys={"user": "text"}, combiner="count"),
    ],
    application="../spark_jobs/s3_amounts.py",
    schedule=SCHEDULE,
    max_in_flight=2,
    **spark_backend(),  # local Spark per batch; a Spark Connect server with $AIRFLOW_TXN_SPARK_CONNECT_CONN_ID
    spark_pool=os.environ.get("AIRFLOW_TXN_SPARK_POOL"),  # the demo caps concurrent Spark jobs
)
# --8<-- [end:dag]
