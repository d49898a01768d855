"""The Spark job's per-phase profile (spark/profile.py ``Phases``): wall and CPU-seconds per phase,
summed when a phase comes back, and the CPU of a busy phase told apart from an idle one; a JVM's
CPU by kind of thread, read from /proc."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psutil

from airflow_transactional.spark.profile import Phases, jvm_thread_cpu


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


# Garbage, and a live set the collector must trace and move: full collections of half a million
# strings take the VM thread milliseconds each (short-lived garbage alone can cost it less than
# the 10 ms /proc counts in).
BUSY_JAVA = """
public class Busy {
    public static void main(String[] args) throws Exception {
        long sum = 0;
        String[] live = new String[1 << 19];
        for (int round = 0; round < 30; round++) {
            for (int i = 0; i < 1_000_000; i++) sum += (live[i & ((1 << 19) - 1)] = Integer.toString(i)).length();
            if (round % 6 == 5) System.gc();
        }
        System.out.println(sum);
        System.out.flush();
        Thread.sleep(60_000);
    }
}
"""


def test_a_jvms_cpu_is_told_apart_by_kind_of_thread(tmp_path: Path) -> None:
    assert jvm_thread_cpu(psutil.Process()) is None  # not a JVM: nothing to say
    source = tmp_path / "Busy.java"
    source.write_text(BUSY_JAVA)
    jvm = subprocess.Popen(["java", "-XX:+UseSerialGC", str(source)], stdout=subprocess.PIPE, text=True)
    try:
        assert jvm.stdout is not None and jvm.stdout.readline().strip().isdigit()  # done with its work
        threads = jvm_thread_cpu(psutil.Process(jvm.pid))
    finally:
        jvm.kill()
        jvm.wait()
    assert threads is not None
    assert list(threads) == ["compiling (JIT)", "garbage collection", "running tasks", "other"]
    assert threads["compiling (JIT)"] > 0.1  # the source launcher's javac and the loop get compiled
    assert threads["other"] > threads["running tasks"] == 0  # main is no Spark task thread
    assert threads["garbage collection"] > 0.05  # the live set traced and moved in the VM thread
