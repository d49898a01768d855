"""The sections of ``bench.perf`` that run the benchmark's DAGs on its Airflow (:mod:`bench.harness`):
``pipelining`` (three in flight vs serial), ``overhead`` (an empty transaction vs a no-op DAG run),
``peer`` (ours vs Spark Structured Streaming on the same files, results compared row by row), and
the peak memory of the Spark process trees they ran."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time
from typing import Any

from airflow_transactional.identifiers import qualified_table
from airflow_transactional.sources import EventLog
from airflow_transactional.spark.submit import spark_submit_argv, with_quiet_driver_logs
from airflow_transactional.spec import DEFAULT_STATE_SCHEMA
from bench.harness import Harness
from bench.measure import BACKENDS, BIG_BATCH_CONF, CpuMeter, Row, event_payload, execute, median, parse_ts
from bench.work import PEER_JOB

log = logging.getLogger("bench.perf")

#: The goals against Structured Streaming, by (backend, events a batch): events/s ours / the peer's.
PEER_TARGETS = {("spark-submit", 1_000_000): 0.8, ("spark-submit", 5_000_000): 1.0, ("Spark Connect", 1_000_000): 1.2}


def bench_pipelining(h: Harness, backend: str) -> None:
    s, suffix = h.sizes, BACKENDS[backend]
    n = s.pipeline_transactions * s.pipeline_batch
    rng = random.Random(11)
    events = [(f"p{i}", event_payload(rng, s.distinct_urls)) for i in range(n)]
    results, cpu = {}, {}
    serial_id, piped_id = f"bench_serial{suffix}", f"bench_pipelined{suffix}"
    for dag_id in (serial_id, piped_id):
        el = EventLog(h.stack.state_dsn, dag_id)
        el.append(events)
        el.close()
        with h.memory.measuring(dag_id), CpuMeter() as cpu[dag_id]:
            runs = [h.trigger(dag_id) for _ in range(s.pipeline_transactions)]
            results[dag_id] = h.throughput(dag_id, runs, timeout=120 + 90 * s.pipeline_transactions)
    (serial, _, t_serial), (piped, _, t_piped) = results[serial_id], results[piped_id]
    h.report.add(Row("pipelining", f"{backend}: {s.pipeline_transactions} txns x {s.pipeline_batch:,} "
                                      f"events of words, max_in_flight={s.max_in_flight} vs serial",
                        f"{piped:,.0f} ev/s ({t_piped:.0f} s)", f"{serial:,.0f} ev/s ({t_serial:.0f} s)",
                        piped / serial, ">= 1.8x", piped / serial >= 1.8,
                        f"{backend}: cores busy {cpu[serial_id].busy:.0%} serial, "
                        f"{cpu[piped_id].busy:.0%} pipelined"))

def bench_overhead(h: Harness) -> None:
    ours, noop = [], []
    for _ in range(h.sizes.overhead_runs):
        run = h.trigger("bench_empty")
        r = h.wait_runs("bench_empty", [run], 300)[0]
        c = h.commits("bench_empty", [run])[0]
        ours.append((c["committed_at"] - parse_ts(r["start_date"])).total_seconds())
        run = h.trigger("bench_noop")
        r = h.wait_runs("bench_noop", [run], 300)[0]
        noop.append((parse_ts(r["end_date"]) - parse_ts(r["start_date"])).total_seconds())
    o, b = median(ours), median(noop)
    h.report.add(Row("overhead", "empty transaction, run start -> committed, vs no-op 3-task DAG run",
                        f"{o:.1f} s", f"{b:.1f} s", o / b, "<= 2x", o / b <= 2))

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

def bench_peer_alone(h: Harness) -> dict[int, dict[str, Any]]:
    """The peer runs before Airflow starts: it has the machine to ith."""
    out = {}
    for size in h.sizes.peer_batches:
        h.batch_files(size)
        out[size] = run_peer(h, size)
        log.info("peer %d: %s", size, {k: v for k, v in out[size].items() if k != "batches"})
    return out

def bench_peer_ours(h: Harness, peer: dict[int, dict[str, Any]], backend: str) -> None:
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

def memory_rows(h: Harness) -> None:
    for label, peak in sorted(h.memory.peaks.items()):
        what = ("Structured Streaming peer (its driver + Python workers)" if label.startswith("peer-")
                else "Spark Connect server, all batches (JVM + Python workers)" if label.endswith("_sc")
                else "processing task (spark-submit driver + Python workers)")
        h.report.add(Row("peak memory", f"{what}: {label}", f"{peak / 2**20:,.0f} MiB", "", None))
