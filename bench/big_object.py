"""``python -m bench.big_object``: one object past a batch's byte cap, end to end on the real S3
server -- a JSON-lines object of ``--gib`` GiB (default 5, S3's largest single upload, here
uploaded in parts) between two small files, in a landing topology whose ``max_batch_bytes`` is
1 GiB. The plan puts it in a batch of its own (and says so), ``spark-submit`` (s3a) processes each
batch, the commits count every line once: the sums equal those written. Prints, and writes with
``--json``, the object's size and the seconds of each step.

A run takes a few minutes and as much free disk as the object (S3Proxy keeps it in a file).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from airflow_transactional import LandingDirectory, SparkJob, StateSpec, TopologySpec
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.spark.jars import s3a_connector
from airflow_transactional.spark.submit import provider_zip, spark_submit_argv, with_quiet_driver_logs
from bench.measure import dirty_result, execute, git_commit, machine, run_measured
from dev.embedded import EmbeddedPostgres
from dev.s3 import S3Server

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "spark_jobs" / "s3_amounts.py"
BUCKET, USERS = "big-object", 100
PAD = "x" * 200  # a line of about 250 bytes


class Lines(io.RawIOBase):
    """``size`` bytes (about) of JSON lines ``{"user": ..., "amount": ..., "pad": ...}``, generated as read;
    the sums per user of what was read kept in ``totals``."""

    def __init__(self, size: int, first: int = 0) -> None:
        self.size, self.n, self.sent, self.pending = size, first, 0, b""
        self.totals: dict[str, int] = {}
        self.lines = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending and self.sent < self.size:
            chunk = []
            for _ in range(4096):
                user, amount = f"u{self.n % USERS}", self.n % 997
                self.totals[user] = self.totals.get(user, 0) + amount
                chunk.append(json.dumps({"user": user, "amount": amount, "pad": PAD}))
                self.n += 1
            self.lines += len(chunk)
            self.pending = ("\n".join(chunk) + "\n").encode()
            self.sent += len(self.pending)
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def upload(s3: S3Server, key: str, size: int, first: int, scratch: Path) -> Lines:
    """The lines written to a file first (an upload of a stream that cannot seek holds its parts in
    memory), then uploaded in parts of 64 MiB."""
    from boto3.s3.transfer import TransferConfig

    lines = Lines(size, first)
    with open(scratch, "wb") as fh:
        while block := lines.read(8 << 20):
            fh.write(block)
    s3.client().upload_file(str(scratch), BUCKET, key, Config=TransferConfig(multipart_chunksize=64 << 20,
                                                                             max_concurrency=2))
    scratch.unlink()
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.big_object", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=5.0, help="the big object's size in GiB (default 5)")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    if dirty := dirty_result(args.json):
        parser.error(dirty)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    started = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": git_commit(), "machine": machine(),
               "command": " ".join(["python", "-m", "bench.big_object", *(sys.argv[1:] if argv is None else argv)])}
    with tempfile.TemporaryDirectory(prefix="big-object-") as tmp:
        base = Path(tmp)
        pg, s3 = EmbeddedPostgres(base / "pg").start(), S3Server(base / "s3").start()
        try:
            result = run(pg.create_database("airflow_txn"), s3, base, int(args.gib * (1 << 30)))
        finally:
            s3.stop(remove=True)
            pg.stop()
    result.update(started)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["sums_equal"] else 1


def run(dsn: str, s3: S3Server, base: Path, size: int) -> dict[str, Any]:
    s3.create_bucket(BUCKET)
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    scratch = base / "object.json"
    written = [upload(s3, "in/a.json", 1 << 20, 0, scratch)]
    time.sleep(1.1)  # S3 keeps a second of an upload's time: arrival order by name
    written.append(upload(s3, "in/big.json", size, 10**9, scratch))
    time.sleep(1.1)
    written.append(upload(s3, "in/c.json", 1 << 20, 2 * 10**9, scratch))
    seconds["upload"] = time.monotonic() - t0
    big = s3.client().head_object(Bucket=BUCKET, Key="in/big.json")
    env = {"AIRFLOW_CONN_BIG": s3.airflow_connection(), "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable}
    os.environ.update(env)
    said: list[str] = []
    catch = logging.Handler(logging.WARNING)
    catch.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("airflow_transactional.sources.landing").addHandler(catch)
    coord = Coordinator(dsn)
    coord.register(TopologySpec("big", LandingDirectory(f"s3a://{BUCKET}/in", conn_id="big", settle_seconds=0,
                                                        max_batch_bytes=1 << 30), [
        StateSpec("s3_order_totals", {"user": "text"}, combiner="sum", table="big_totals"),  # the job's states
        StateSpec("s3_order_counts", {"user": "text"}, combiner="count", table="big_counts")], job=SparkJob(str(JOB))))
    batches, cpu = [], 0.0
    conf = with_quiet_driver_logs({"spark.driver.memory": "2g"})
    jars = ",".join(str(p) for p in s3a_connector().fetch())
    for k in range(1, 6):  # until a plan finds nothing more
        t0 = time.monotonic()
        txn = coord.plan("big", f"r{k}")
        seconds[f"plan {k}"] = time.monotonic() - t0
        if txn.empty:
            break
        batches.append([f["path"].rsplit("/", 1)[1] for f in txn.batch["files"]])
        argv = [*spark_submit_argv("local[2]", conf, "--name", f"big-{k}"), "--jars", jars,
                "--py-files", provider_zip(), str(JOB), "--topology", "big", "--txid", str(txn.txid)]
        c, wall = run_measured(argv, {**os.environ, **env}, f"big: txid {txn.txid}")
        cpu += c
        seconds[f"process {k}"] = wall
        t0 = time.monotonic()
        assert coord.commit("big", txn.txid).committed
        seconds[f"commit {k}"] = time.monotonic() - t0
    coord.close()
    want: dict[str, int] = {}
    for lines in written:
        for user, total in lines.totals.items():
            want[user] = want.get(user, 0) + total
    got = {u: int(v) for u, v in execute(dsn, "SELECT \"user\", value FROM big_totals")}
    counted = sum(int(v) for (v,) in execute(dsn, "SELECT value FROM big_counts"))
    return {"object_bytes": int(big["ContentLength"]), "object_etag": str(big["ETag"]), "batches": batches,
            "lines_written": sum(w.lines for w in written), "lines_counted": counted, "sums_equal": got == want,
            "plan_said": said,
            "seconds": {k: round(v, 1) for k, v in seconds.items()}, "spark_cpu_seconds": round(cpu, 1)}


if __name__ == "__main__":
    raise SystemExit(main())
