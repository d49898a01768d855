"""The job's profile: wall and CPU-seconds per phase of the whole Spark process tree, and the
driver JVM's CPU by kind of thread (JIT, garbage collection, tasks) -- what the per-phase profile
of docs/benchmarks.md and the bench's notes are read from."""

from __future__ import annotations

import os
import re
import time
from typing import Any


class Phases:
    """Where one run of the job spends its time: wall seconds and CPU-seconds of the whole Spark
    process tree (driver JVM, executors, Python workers, this driver), phase by phase.

    The first phase, ``launch``, is what happened before this Python started (the driver JVM's
    own start). CPU is read from the process tree when ``psutil`` is importable (it comes with
    Airflow), else only wall time is kept. The result (``--result-file``) and the log carry it.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}
        root = _spark_root()
        self._wall, self._cpu = time.perf_counter(), tree_cpu(root)
        if root is not None and self._cpu is not None:
            self.seconds["launch"] = round(max(0.0, time.time() - root.create_time()), 3)
            self.cpu_seconds["launch"] = round(self._cpu, 3)
        self._root = root
        self.jvm_threads: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        wall, cpu = time.perf_counter(), tree_cpu(self._root)
        self.seconds[phase] = round(self.seconds.get(phase, 0.0) + wall - self._wall, 3)
        if cpu is not None and self._cpu is not None and cpu >= self._cpu:  # less: workers ended, their time gone
            self.cpu_seconds[phase] = round(self.cpu_seconds.get(phase, 0.0) + cpu - self._cpu, 3)
        self._wall, self._cpu = wall, cpu

    def summary(self) -> dict[str, dict[str, float]]:
        return {"seconds": dict(self.seconds), **({"cpu_seconds": dict(self.cpu_seconds)} if self.cpu_seconds else {}),
                **({"jvm_threads": dict(self.jvm_threads)} if self.jvm_threads else {})}

    def threads(self) -> None:
        """Keep what the driver JVM's threads have cost so far (:func:`jvm_thread_cpu`): called
        before Spark stops, while its task threads still exist."""
        self.jvm_threads = jvm_thread_cpu(self._root) or {}


def _spark_root() -> Any:
    """The root of the Spark process tree this driver belongs to (None without ``psutil``).

    Under ``spark-submit`` the Python driver is a child of the driver JVM, whose other children
    are the Python workers; with Spark Connect the work is in the server, and the tree is this
    client alone.
    """
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    parent = me.parent()
    return parent if parent is not None and "java" in parent.name() else me


#: The driver JVM's threads by what they do, by their names as Linux keeps them (15 characters).
#: The serial collector, which the provider's drivers use, collects in the VM thread.
JVM_THREAD_KINDS = (("compiling (JIT)", re.compile(r"C[12] CompilerThre")),
                    ("garbage collection", re.compile(r"VM Thread|GC Thread|G1 |ParGC")),
                    ("running tasks", re.compile(r"Executor task")))


def jvm_thread_cpu(root: Any = None) -> dict[str, float] | None:
    """CPU-seconds so far of the driver JVM's threads by what they do -- the JIT compiling, garbage
    collection, Spark's task threads, and the rest (the driver's own threads, I/O) -- read from
    Linux's /proc. ``root`` is the JVM (default: this driver's, see :func:`_spark_root`); None
    where there is no JVM (a Spark Connect client) or no /proc."""
    root = root if root is not None else _spark_root()
    try:
        if root is None or "java" not in root.name():
            return None
        tids = os.listdir(f"/proc/{root.pid}/task")
    except Exception:  # psutil's errors, or no /proc
        return None
    tick = os.sysconf("SC_CLK_TCK")
    out = dict.fromkeys([*(kind for kind, _ in JVM_THREAD_KINDS), "other"], 0.0)
    for tid in tids:
        try:
            with open(f"/proc/{root.pid}/task/{tid}/stat", encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
        except OSError:  # a thread that ended meanwhile
            continue
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        kind = next((k for k, pattern in JVM_THREAD_KINDS if pattern.match(name)), "other")
        out[kind] += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return {kind: round(cpu, 3) for kind, cpu in out.items()}


def tree_cpu(root: Any) -> float | None:
    """CPU-seconds so far of a ``psutil.Process`` and its live descendants (None for no process)."""
    if root is None:
        return None
    import psutil

    total = 0.0
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # a worker that ended meanwhile: its time is in its parent's children_*
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total
