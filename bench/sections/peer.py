"""The ``peer`` section of ``bench.perf``: events/s of ours (the benchmark's Airflow running a
landing topology, one file per transaction, triggered over REST) vs Spark Structured Streaming with
an exactly-once ``foreachBatch`` sink (:mod:`bench.sss_peer`) on the same files, the same batch
size, the same aggregates; both final states are compared row by row. The peer runs first
(:func:`alone`), before Airflow starts, with the machine to itself; ours after (:func:`ours`), once
per backend."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from airflow_transactional.identifiers import qualified_table
from airflow_transactional.spark.submit import spark_submit_argv, with_quiet_driver_logs
from airflow_transactional.spec import DEFAULT_STATE_SCHEMA
from bench.harness import Harness
from bench.measure import BACKENDS, BIG_BATCH_CONF, PEER_JOB, CpuMeter, Row, execute

log = logging.getLogger("bench.perf")

#: The goals against Structured Streaming, by (backend, events a batch): events/s ours / the peer's.
PEER_TARGETS = {("spark-submit", 1_000_000): 0.8, ("spark-submit", 5_000_000): 1.0, ("Spark Connect", 1_000_000): 1.2,
                ("Spark Connect", 5_000_000): 1.0}


def run_peer(h: Harness, size: int) -> dict[str, Any]:
    result_file = h.base / f"peer-{size}.json"
    checkpoint = h.base / f"peer-checkpoint-{size}"
    shutil.rmtree(checkpoint, ignore_errors=True)
    conf = with_quiet_driver_logs(BIG_BATCH_CONF)
    argv = spark_submit_argv("local[2]", conf, "--name", f"sss-peer-{size}")
    argv += [str(PEER_JOB), str(h.data / str(size)), str(checkpoint), f"bench_peer_{size}", str(result_file)]
    env = {**os.environ, "AIRFLOW_TXN_DSN": h.stack.state_dsn, "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    t0 = time.monotonic()
    with h.memory.measuring(f"peer-{size}"), CpuMeter() as cpu:
        with open(h.base / f"peer-{size}.log", "w") as err:
            subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=err)
    result: dict[str, Any] = json.loads(result_file.read_text())
    result["wall_seconds"] = time.monotonic() - t0
    result["cpu_busy"] = cpu.busy
    return result


def alone(h: Harness) -> dict[int, dict[str, Any]]:
    """The peer on each size's files, before Airflow starts: it has the machine to itself."""
    out = {}
    for size in h.sizes.peer_batches:
        h.batch_files(size)
        out[size] = run_peer(h, size)
        log.info("peer %d: %s", size, {k: v for k, v in out[size].items() if k != "batches"})
    return out


def ours(h: Harness, peer: dict[int, dict[str, Any]], backend: str) -> None:
    for size in h.sizes.peer_batches:
        dag_id = f"bench_landing_{size}{BACKENDS[backend]}"
        landing = h.base / "landing" / dag_id
        for path in h.batch_files(size):  # copies: the landing directory refuses hard-linked files
            shutil.copyfile(path, landing / path.name)
        with h.memory.measuring(dag_id), CpuMeter() as cpu:
            runs = [h.trigger(dag_id) for _ in range(h.sizes.batches_of(size))]
            ours, events, seconds = h.throughput(dag_id, runs, timeout=600 + size / 2000)
        p = peer[size]
        peer_rate = p["events"] / p["query_seconds"]
        same = same_results(h, dag_id, f"bench_peer_{size}")
        target = PEER_TARGETS.get((backend, size))
        h.report.add(Row(
            "vs Structured Streaming", f"{backend}: {h.sizes.batches_of(size)} batches x {size:,} events",
            f"{ours:,.0f} ev/s ({seconds:.0f} s)", f"{peer_rate:,.0f} ev/s ({p['query_seconds']:.0f} s)",
            ours / peer_rate, f">= {target}x at {size // 1_000_000}M" if target else "",
            (ours / peer_rate >= target) if target else None,
            f"{backend}, {size:,}/batch: cores busy {cpu.busy:.0%} ours, {p['cpu_busy']:.0%} the peer"
            + ("; both states identical to the peer's" if same else "; RESULTS DIFFER from the peer's")))
        if events != p["events"]:
            h.report.rows[-1].note += f" ours read {events} events, the peer {p['events']}"


def same_results(h: Harness, ours_prefix: str, peer_prefix: str) -> bool:
    differ = 0
    for key in ("url", "domain"):
        ours_t = ".".join(f'"{p}"' for p in qualified_table(f"{ours_prefix}_{key}_counts", DEFAULT_STATE_SCHEMA))
        peer_t = f"{peer_prefix}_{key}_counts"
        differ += execute(h.stack.state_dsn, f"SELECT count(*) FROM {ours_t} o FULL JOIN {peer_t} p "
                                               f"ON o.{key} = p.{key} WHERE o.value IS DISTINCT FROM p.value")[0][0]
    return differ == 0
