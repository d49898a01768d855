"""The Spark job's per-phase profile (spark/job.py ``Phases``): wall and CPU-seconds per phase,
summed when a phase comes back, and the CPU of a busy phase told apart from an idle one."""

from __future__ import annotations

import time

from airflow_transactional.spark.job import Phases


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_each_phase_gets_its_own_wall_and_cpu_time() -> None:
    phases = Phases()
    _spin(0.3)
    phases.lap("busy")
    time.sleep(0.3)
    phases.lap("idle")
    _spin(0.2)
    phases.lap("busy")
    summary = phases.summary()
    assert list(summary["seconds"]) == ["launch", "busy", "idle"]  # launch: before the job's Python ran
    assert summary["seconds"]["busy"] >= 0.5 and summary["seconds"]["idle"] >= 0.3
    cpu = summary["cpu_seconds"]
    assert cpu["busy"] >= 0.1 and cpu["busy"] > 3 * cpu["idle"], cpu  # spinning vs asleep, on a busy machine too
