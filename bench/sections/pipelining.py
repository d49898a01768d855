"""The ``pipelining`` section of ``bench.perf``: N transactions of ``words`` with
``max_in_flight=3`` vs the same N serial, on the benchmark's Airflow, both backends."""

from __future__ import annotations

import random

from airflow_transactional.sources import EventLog
from bench.harness import Harness
from bench.measure import BACKENDS, CpuMeter, Row, event_payload


def run(h: Harness, backend: str) -> None:
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
