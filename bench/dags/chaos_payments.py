"""The payments example (``dags/payments.py``, both stages, under their own names) with its batches
on the stack's Spark Connect server: ``bench.chaos --mode payments --backend connect`` deploys this
file into the stack's DAGs folder (a symlink) in place of the example. The example picks its Spark
with ``spark_backend()``, from the environment of whatever parses it; this file sets that for its
own parse alone (the dag-processor and each task parse a file in a process of their own), so the
other DAG files of a shared stack keep ``spark-submit``."""

import os
import runpy
from pathlib import Path

from airflow_transactional.spark.submit import SPARK_CONNECT_CONN_ENV

EXAMPLE = Path(__file__).resolve().parents[2] / "dags" / "payments.py"

os.environ[SPARK_CONNECT_CONN_ENV] = "spark_connect_default"
# The example's DAGs become this module's: Airflow finds them here and names this file theirs.
payments, settlement = (runpy.run_path(str(EXAMPLE))[name] for name in ("payments", "settlement"))
