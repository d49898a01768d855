"""The peer the benchmark measures against: Spark Structured Streaming with a ``foreachBatch`` sink.

Reads the same JSON-lines files as the provider's landing topology (one file per micro-batch,
``maxFilesPerTrigger=1``) -- or, given ``kafka://SERVERS/TOPIC``, the same events in a Kafka topic
(read_committed, all of it in one micro-batch) -- computes the same two aggregates as ``spark_jobs/words.py`` (the
same Column expressions), and writes them to Postgres exactly once the way Spark's guide
recommends for ``foreachBatch``: the batch's rows and its ``batchId`` in one database
transaction, a ``batchId`` already recorded is skipped. Run by ``bench.perf`` under
``spark-submit``; prints nothing but a JSON result file.

    spark-submit bench/sss_peer.py INPUT_DIR|kafka://SERVERS/TOPIC CHECKPOINT_DIR TABLE_PREFIX RESULT_FILE [warm]
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Callable

import psutil
import psycopg2
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_transactional.spark.profile import jvm_thread_cpu, tree_cpu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "spark_jobs"))
from words import domain  # the user's own expression, shared by both sides

SCHEMA = "url string, user string, ts string"


def tables(prefix: str) -> dict[str, str]:
    return {"url": f"{prefix}_url_counts", "domain": f"{prefix}_domain_counts", "batches": f"{prefix}_batches"}


def create_tables(dsn: str, prefix: str) -> None:
    t = tables(prefix)
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {t['url']} (url text PRIMARY KEY, value bigint NOT NULL)")
        cur.execute(f"CREATE TABLE IF NOT EXISTS {t['domain']} (domain text PRIMARY KEY, value bigint NOT NULL)")
        cur.execute(f"CREATE TABLE IF NOT EXISTS {t['batches']} (batch_id bigint PRIMARY KEY, "
                    "rows integer NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())")
    conn.close()


def upsert(cur: psycopg2.extensions.cursor, table: str, key: str, rows: list[tuple[str, int]]) -> None:
    buf = io.StringIO("".join(f"{k}\t{v}\n" for k, v in rows))
    cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS delta_{key} ({key} text, value bigint) ON COMMIT DELETE ROWS")
    cur.copy_expert(f"COPY delta_{key} FROM STDIN", buf)
    cur.execute(f"INSERT INTO {table} ({key}, value) SELECT {key}, value FROM delta_{key} "
                f"ON CONFLICT ({key}) DO UPDATE SET value = {table}.value + EXCLUDED.value")


def writer(conn: psycopg2.extensions.connection, prefix: str,
           batches: list[dict[str, float]]) -> Callable[[DataFrame, int], None]:
    """The ``foreachBatch`` function writing into ``prefix``'s tables, noting each batch in ``batches``."""
    t = tables(prefix)

    def write(df: DataFrame, batch_id: int) -> None:
        t0 = time.monotonic()
        df.persist()
        urls = df.where(F.col("url").isNotNull()).select("url", domain(F.col("url")).alias("domain"))
        url_rows = [(r[0], r[1]) for r in urls.groupBy("url").count().collect()]
        domain_rows = [(r[0], r[1]) for r in urls.where(F.col("domain") != "").groupBy("domain").count().collect()]
        events = df.count()
        df.unpersist()
        with conn, conn.cursor() as cur:  # one transaction: the rows and the batch id
            cur.execute(f"SELECT 1 FROM {t['batches']} WHERE batch_id = %s", (batch_id,))
            if cur.fetchone() is None:
                upsert(cur, t["url"], "url", url_rows)
                upsert(cur, t["domain"], "domain", domain_rows)
                cur.execute(f"INSERT INTO {t['batches']} (batch_id, rows) VALUES (%s, %s)", (batch_id, events))
        batches.append({"batch_id": batch_id, "events": events, "seconds": time.monotonic() - t0})

    return write


def stream_of(spark: SparkSession, input_dir: str) -> DataFrame:
    if input_dir.startswith("kafka://"):  # the same events in a topic: all of it in one micro-batch
        servers, topic = input_dir[len("kafka://"):].split("/", 1)
        raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", servers)
               .option("subscribe", topic).option("startingOffsets", "earliest")
               .option("kafka.isolation.level", "read_committed").option("failOnDataLoss", "true").load())
        return raw.select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e")).select("e.*")
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(input_dir)


def run_query(spark: SparkSession, conn: psycopg2.extensions.connection, input_dir: str, checkpoint: str,
              prefix: str, batches: list[dict[str, float]]) -> None:
    """The recipe's query over all of ``input_dir`` (``availableNow``), into ``prefix``'s tables."""
    query = (stream_of(spark, input_dir).writeStream.foreachBatch(writer(conn, prefix, batches))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()


def main(argv: list[str]) -> int:
    """``INPUT CHECKPOINT PREFIX RESULT [warm]``: with ``warm``, the query runs once over the same
    input into ``PREFIX_warmup`` first, and the result also holds the CPU-seconds of the JVM and
    this driver during the measured query alone (``query_cpu_seconds``): the peer at its JIT's best."""
    input_dir, checkpoint, prefix, result_file = argv[:4]
    warm = argv[4:] == ["warm"]
    dsn = os.environ["AIRFLOW_TXN_DSN"]
    started = time.monotonic()
    spark = SparkSession.builder.appName("sss-peer").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    session_ready = time.monotonic()
    for tables_of in ([prefix, f"{prefix}_warmup"] if warm else [prefix]):
        create_tables(dsn, tables_of)
    conn = psycopg2.connect(dsn, application_name="bench:sss_peer")
    if warm:
        run_query(spark, conn, input_dir, f"{checkpoint}-warmup", f"{prefix}_warmup", [])
    jvm = psutil.Process(os.getppid())  # spark-submit's JVM runs this driver: its executors, and this process
    cpu_before = tree_cpu(jvm)
    batches: list[dict[str, float]] = []
    query_started = time.monotonic()
    run_query(spark, conn, input_dir, checkpoint, prefix, batches)
    finished = time.monotonic()
    cpu_after = tree_cpu(jvm)
    threads = jvm_thread_cpu()  # before Spark stops its task threads
    spark.stop()
    conn.close()
    with open(result_file, "w", encoding="utf-8") as fh:
        json.dump({"startup_seconds": session_ready - started, "query_seconds": finished - query_started,
                   "query_cpu_seconds": None if cpu_before is None or cpu_after is None else cpu_after - cpu_before,
                   "measured_process": jvm.name(),
                   "batches": batches, "events": sum(b["events"] for b in batches), "jvm_threads": threads}, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
