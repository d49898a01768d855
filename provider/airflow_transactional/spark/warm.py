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
import sys
import time
from typing import TYPE_CHECKING

from ..exceptions import ConfigError, TransactionalError
from ..spec import StateSpec
from .fused import fuse, per_record
from .read import EVENT_ID_COL, OFFSET_COL, TEXT, Records
from .validate import prepare

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ROUNDS", "warm", "warm_server"]

log = logging.getLogger(__name__)

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
    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        took = warm(spark, rounds, records)
    finally:
        spark.stop()
    log.info("warmed the Spark Connect server: %s", ", ".join(f"{t:.1f} s" for t in took))
    return took


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
