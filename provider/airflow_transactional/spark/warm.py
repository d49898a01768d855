"""Warming a Spark Connect server before its first batch.

A Spark Connect server is one JVM for every batch: its first batches pay for loading classes,
generating and compiling code, and the JIT's climb from interpreted to compiled code (a cold
server took 12-15 s for the benchmark's first wave against 4-11 s later). :func:`warm` runs what
a batch runs -- records parsed from JSON and judged (:func:`.validate.prepare`), two states
declared per record folded in one pass with a regex and case mapping in a key
(:class:`.fused.FusedFolds`), the folded rows brought back as Arrow -- on records it makes up
on the server, a few rounds, so the first real batch finds the server warm. It reads no file and
ships no Python: any server a job could use can be warmed, from any client.

The stacks of ``dev/`` warm their server once it listens; for your own server, run
``SPARK_REMOTE=sc://host:15002/;token=... python -m airflow_transactional.spark.warm`` (the
token in the environment, never on a command line) after it starts.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from ..connections import redact
from ..exceptions import ConfigError, TransactionalError
from ..spec import StateSpec
from .fused import fuse, per_record
from .read import EVENT_ID_COL, OFFSET_COL, TEXT, Records
from .validate import prepare

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ROUNDS", "warm", "warm_in_child", "warm_server"]

log = logging.getLogger(__name__)

#: What PySpark sets in the environment when a process opens a Spark Connect session.
CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"
#: Rounds of made-up records, and records per round: enough for the JIT to compile the hot loops.
ROUNDS, RECORDS = 3, 200_000
_SCHEMA = "url string, user string, n long"
_STATES = [StateSpec("warm_urls", keys={"url": "text"}, combiner="count"),
           StateSpec("warm_hosts", keys={"host": "text"}, combiner="sum")]


def _one_round(spark: SparkSession, records: int) -> int:
    """One batch's work on ``records`` made-up records; the folded rows' count: one per record
    (no two URLs alike below 97 x 20,011 records) and one per host (97)."""
    from pyspark.sql import functions as F

    n = F.col("id")
    url = F.concat(F.lit("https://WWW.Example"), (n % 97).cast("string"), F.lit(".org/p/"), (n % 20011).cast("string"))
    payload = F.to_json(F.struct(url.alias("url"), F.concat(F.lit("u"), (n % 1000).cast("string")).alias("user"),
                                 n.alias("n")))
    raw = spark.range(records).select(F.lit("warm").alias(OFFSET_COL), F.lit(None).cast("string").alias(EVENT_ID_COL),
                                      payload.alias("payload"))
    prepared = prepare(Records(raw, TEXT), _SCHEMA, ["url"])
    good = prepared.good
    host = F.regexp_replace(F.lower(F.regexp_extract("url", r"^[a-zA-Z][a-zA-Z0-9+.-]*://([^/:?#]+)", 1)),
                            r"^www\.", "")
    folds = fuse(_STATES, {"warm_urls": per_record(good, {"url": F.col("url")}),
                           "warm_hosts": per_record(good, {"host": host}, value="n", where=host != "")}, good)
    assert folds is not None  # both states are declared per record over the same records
    kept = folds.run()
    try:
        return int(kept.count())
    finally:
        kept.unpersist()


def warm(spark: SparkSession, rounds: int = ROUNDS, records: int = RECORDS) -> list[float]:
    """Run ``rounds`` rounds of a batch's work on ``records`` (at most 1,900,000) made-up records
    in ``spark``, each checked; the seconds each took (they flatten out as the server warms)."""
    if not 0 < records <= 1_900_000:
        raise ConfigError(f"warm: records is 1 to 1,900,000 per round, got {records}")
    took = []
    for _ in range(rounds):
        started = time.monotonic()
        folded = _one_round(spark, records)
        if folded != records + min(records, 97):
            raise TransactionalError(f"warming the Spark server: {records:,} made-up records folded into {folded:,} "
                                     f"rows, not {records + min(records, 97):,}: the server computes wrongly")
        took.append(time.monotonic() - started)
    return took


def warm_server(url: str, rounds: int = ROUNDS, records: int = RECORDS) -> list[float]:
    """:func:`warm` the Spark Connect server at ``url`` (``sc://host:port/;token=...``) in a
    session of its own, released after."""
    from pyspark.sql import SparkSession

    if not url.startswith("sc://"):
        raise ConfigError(f"a Spark Connect URL starts with sc://, e.g. sc://localhost:15002/;token=...; "
                          f"got {url[:5]!r}...")
    # A remote session marks the whole process (and the processes it starts) as Spark Connect's:
    # the mark goes with the session, so that a classic session started here later still works.
    mark = os.environ.get(CONNECT_MODE_ENV)
    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        took = warm(spark, rounds, records)
    finally:
        spark.stop()
        if mark is None:
            os.environ.pop(CONNECT_MODE_ENV, None)
        else:
            os.environ[CONNECT_MODE_ENV] = mark
    log.info("warmed the Spark Connect server: %s", ", ".join(f"{t:.1f} s" for t in took))
    return took


def warm_in_child(url: str, env: dict[str, str] | None = None, timeout: float = 600) -> list[float]:
    """:func:`warm_server` in a Python process of its own (``python -m airflow_transactional.spark.warm``,
    the URL and its token in its environment): nothing of a Connect client stays in the caller."""
    res = subprocess.run([sys.executable, "-m", __name__], env={**(env or os.environ), "SPARK_REMOTE": url},
                         capture_output=True, text=True, timeout=timeout, check=False)
    said = res.stdout.strip().splitlines()
    if res.returncode != 0 or not said or not said[-1].startswith("warmed: "):
        raise TransactionalError(f"warming the Spark Connect server failed ({res.returncode}):\n"
                                 f"{redact(res.stderr[-3000:])}")
    return [float(t.rstrip(" s")) for t in said[-1][len("warmed: "):].split(", ")]


def main() -> int:
    url = os.environ.get("SPARK_REMOTE", "")
    if not url:
        print("set SPARK_REMOTE to the server's sc:// URL (with its token) and run again", file=sys.stderr)
        return 2
    took = warm_server(url)
    print("warmed: " + ", ".join(f"{t:.1f} s" for t in took))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
