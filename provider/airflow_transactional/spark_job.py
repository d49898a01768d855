"""The Spark side of a topology: a job author writes ``transform(records) -> {state: DataFrame}``.

A job file in ``spark_jobs/`` is::

    from airflow_transactional.spark_job import run

    def transform(events):                      # events: one row per good source record
        return {"url_counts": events.select("url", F.lit(1).alias("value"))}

    if __name__ == "__main__":
        run(transform, schema="url string, user string", required=["url"])

``run`` does the rest, with the same rules as the pure-Python :mod:`processing`:

* reads the planned batch of ``--txid``, never more or less than the plan: landing files with
  Spark's own readers; Postgres log ranges spooled by the driver as CSV files for the JVM's
  reader where the executors see them (a local master, or ``spark.airflow_transactional.logSpoolDir``),
  else in parallel chunks on the executors;
* parses and validates records: malformed payloads and records missing a ``required`` field
  go to the quarantine with their offset and the reason (or fail the attempt when the topology
  says ``on_bad_record="fail"``);
* folds each state's rows per key with the state's combiner and COPYs the partials into the
  staging table of (txid, attempt) -- from the driver when they are small, else from the
  executors. States declared per record (``per_record(events, {"url": F.col("url")})``) are
  all folded in one pass over the batch, which is never cached; a state given as any other
  DataFrame gets a job of its own over the cached batch;
* records the attempt complete with its row counts -- or failed, so it is never committed.

``--audit`` recomputes every state from the source over the committed offsets in one pass and
diffs it against the state tables (``airflow-txn audit`` runs it).

The DSN comes from a file named by ``--dsn-file`` (or ``$AIRFLOW_TXN_DSN_FILE``, or
``$AIRFLOW_TXN_DSN``), never from argv, which ``ps`` and logs show (see :mod:`submit`).

With ``$SPARK_REMOTE`` set (``sc://host:port``) the job is a Spark Connect client of a
long-lived Spark instead of a ``spark-submit`` driver: the same file runs under plain
``python``, a batch pays no JVM start-up, and the executor-side steps (reading log chunks,
COPYing partials) run as Arrow batches (``mapInArrow``) since Connect has no RDDs.
"""

from __future__ import annotations

from .spark.fused import per_record
from .spark.job import REMOTE_ENV, Transform, audit, parse_args, process, rebuild, run
from .spark.read import EVENT_ID_COL, OFFSET_COL, is_remote, raw_records, readable_batch
from .spark.stage import copy_batches, copy_dataframe, fold
from .spark.validate import spark_schema, validate
from .submit import provider_zip, quiet_log_config, with_quiet_driver_logs

# The Spark helper lives in the spark/ package; job files and users import it from here.
__all__ = ["EVENT_ID_COL", "OFFSET_COL", "REMOTE_ENV", "Transform", "audit", "copy_batches", "copy_dataframe",
           "fold", "is_remote", "parse_args", "per_record", "process", "provider_zip", "quiet_log_config",
           "raw_records", "readable_batch", "rebuild", "run", "spark_schema", "validate", "with_quiet_driver_logs"]
