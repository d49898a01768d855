"""Spark's own ports against another local user: a driver the provider starts serves its blocks
-- the staging COPY's task among them -- only to a peer holding the application's secret.

Regression: nothing set ``spark.authenticate``, and ``nobody`` fetched the COPY task's closure
from a ``local[1]`` driver's block manager with a few lines of Python, the state store's
password inside (``tests/blockfetch.py`` is that client)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_transactional.spark.submit import LOCAL_SPARK_CONF, provider_zip, spark_submit_argv
from dev.embedded import free_port
from tests.helpers import fetch_blocks_as_nobody

pytestmark = pytest.mark.spark

#: A driver that stages rows through the provider's executor COPY, then keeps its blocks while
#: another user asks for them.
HOLDER = """
import sys, time
from pyspark.sql import SparkSession
from airflow_transactional.model import Staging
from airflow_transactional.spark.stage import copy_dataframe

spark = SparkSession.builder.getOrCreate()
dsn = open(sys.argv[1]).read()
rows = spark.range(20).selectExpr("cast(id as string) AS word")
print("COPIED", copy_dataframe(spark, rows, dsn, Staging("COPY ports_probe (word) FROM STDIN WITH (FORMAT csv)")),
      flush=True)
time.sleep(float(sys.argv[2]))
"""

#: The blocks a driver holds after a job or two: its tasks' broadcast closures.
BROADCASTS = [f"broadcast_{n}_piece0" for n in range(4)]


def held_driver(tmp_path: Path, dsn: str, port: int, conf: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A ``local[1]`` driver with the provider's settings (and ``conf``) and its block manager on
    ``port``, once it has run the staging COPY."""
    app, secret = tmp_path / "holder.py", tmp_path / "dsn"
    app.write_text(HOLDER)
    secret.write_text(dsn)
    secret.chmod(0o600)
    argv = [*spark_submit_argv("local[1]", {**LOCAL_SPARK_CONF, "spark.blockManager.port": str(port), **(conf or {})}),
            "--py-files", provider_zip(), str(app), str(secret), "90"]
    driver = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable})
    assert driver.stdout is not None
    deadline = time.monotonic() + 120
    for line in driver.stdout:
        if line.startswith("COPIED") or time.monotonic() > deadline:
            break
    assert line.split() == ["COPIED", "20"], "the driver did not stage its rows"
    return driver


def _password(dsn: str) -> str:
    import psycopg2

    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE ports_probe (word text)")
    password = conn.get_dsn_parameters().get("password") or dsn.split("password=")[1].split()[0]
    assert password
    return str(password)


def test_another_local_user_fetches_no_block_from_a_driver(dsn: str, tmp_path: Path) -> None:
    password = _password(dsn)
    port = free_port()
    driver = held_driver(tmp_path, dsn, port)
    try:
        got = fetch_blocks_as_nobody(port, BROADCASTS)
    finally:
        driver.kill()
        driver.wait(30)
    leaked = any(password.encode().hex() in line for line in got.splitlines())
    assert "GOT" not in got, f"nobody fetched the driver's blocks{' (the DSN password inside)' if leaked else ''}"
    # Each ask was turned away by the authentication, not merely by a missing block.
    assert got.count("Expected SaslMessage") == len(BROADCASTS), got


def test_no_task_carries_the_dsn_even_from_a_driver_without_authentication(dsn: str, tmp_path: Path) -> None:
    """Regression: the staging COPY's closure held the DSN, so whoever read a task read the state
    store's password. Now a task carries only the name of the file Spark hands each executor. Run
    unauthenticated on purpose, nobody fetches the tasks -- and finds no password in them."""
    password = _password(dsn)
    port = free_port()
    driver = held_driver(tmp_path, dsn, port, {"spark.authenticate": "false"})
    try:
        got = fetch_blocks_as_nobody(port, BROADCASTS)
    finally:
        driver.kill()
        driver.wait(30)
    blocks = [line.split()[-1] for line in got.splitlines() if " GOT " in line]
    assert blocks, f"the unauthenticated driver served no block: the test proves nothing\n{got}"
    assert not [b for b in blocks if password.encode().hex() in b], "a task the driver shipped holds the DSN's password"
    assert any(b"airflow-txn-dsn-".hex() in b for b in blocks)  # what the COPY's task holds instead: a file's name
