"""What a Spark job file imports: ``from airflow_transactional.spark_job import per_record, run``
(the helper itself is :mod:`airflow_transactional.spark`; :mod:`.spark.job` says what ``run`` does)."""

from __future__ import annotations

from .spark.fused import per_record
from .spark.job import Transform, run

__all__ = ["Transform", "per_record", "run"]
