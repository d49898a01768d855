"""Where a batch runs, as the fault lanes find it to strike it: its spark-submit driver JVM, its
Spark Connect client, the Python workers its executors run the job in."""

from __future__ import annotations

import psutil

from airflow_transactional.spark.job import REMOTE_ENV


def spark_driver(topologies: tuple[str, ...]) -> psutil.Process | None:
    """The spark-submit JVM of a batch of one of the ``topologies``, if one runs."""
    names = {f"txn-{t}" for t in topologies}
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "org.apache.spark.deploy.SparkSubmit" in cmd and names & set(cmd):
            return proc
    return None


def connect_client(topologies: tuple[str, ...]) -> psutil.Process | None:
    """The Spark Connect client running a batch of one of the ``topologies``, if one runs: the job
    file's process, its ``--topology`` one of them, started by a process task (not by spark-submit)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        topology = cmd[cmd.index("--topology") + 1:][:1] if "--topology" in cmd and "--txid" in cmd else []
        if topology and topology[0] in topologies:
            try:
                if proc.environ().get(REMOTE_ENV):
                    return proc
            except psutil.Error:
                continue
    return None


def python_workers(driver: psutil.Process) -> list[psutil.Process]:
    """The batch's Python workers (``pyspark.daemon`` and its forks): where the executors run the
    job's Python -- parsing, folding, the COPY into staging."""
    found = []
    try:
        for child in driver.children(recursive=True):
            try:
                if "pyspark.daemon" in child.cmdline():
                    found.append(child)
            except psutil.Error:
                continue
    except psutil.Error:
        return []
    return found
