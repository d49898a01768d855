"""Small helpers shared by the integration tests (reading state tables, making topologies)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg2

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spark import cds as spark_cds
from airflow_transactional.spark.auth import with_authentication
from airflow_transactional.spark.submit import LOCAL_SPARK_CONF, provider_zip
from airflow_transactional.spec import StateSpec, TopologySpec


def local_conf(conf: dict[str, str] | None = None, java_options: str | None = None) -> list[str]:
    """``--conf`` arguments of a small job on this machine, as the process task sets them
    (``LOCAL_SPARK_CONF``: C1 only, which halves a small job's CPU; the class-data-sharing archive
    when one was built -- run with :func:`startup_env`; Spark's authentication), with ``conf`` and
    ``java_options`` added."""
    jvm = " ".join(filter(None, [LOCAL_SPARK_CONF["spark.driver.extraJavaOptions"], java_options]))
    settings = spark_cds.with_archive({**LOCAL_SPARK_CONF, "spark.driver.extraJavaOptions": jvm,
                                       **(conf or {})}, spark_cds.current())
    settings = with_authentication(settings, "local[2]")
    return [x for k, v in settings.items() for x in ("--conf", f"{k}={v}")]


def startup_env() -> dict[str, str]:
    """What a spark-submit given :func:`local_conf` needs in its environment: the Spark home its
    class-data-sharing archive was built in, as the process task gives it."""
    return spark_cds.env_of(spark_cds.current())


def spark_submit(dsn: str, application: str, *args: str, env: dict[str, str] | None = None,
                 java_options: str | None = None, jars: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """A job under spark-submit (local[2]) with the process task's settings for a small batch
    (``LOCAL_SPARK_CONF``: C1 only, which halves a small job's CPU); its driver starts from the
    class-data-sharing archive when one was built (``airflow-txn spark-cds``), as the task's does."""
    argv = ["spark-submit", "--master", "local[2]", *local_conf(java_options=java_options),
            *(["--jars", ",".join(jars)] if jars else []), "--py-files", provider_zip(), application, *args]
    return subprocess.run(argv, env={**os.environ, "AIRFLOW_TXN_DSN": dsn, "PYSPARK_PYTHON": sys.executable,
                                     **startup_env(), **(env or {})}, capture_output=True, text=True, timeout=300)


def connect_job(dsn: str, remote: str, application: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A job as a client of the Spark Connect server at ``remote``, in the environment the process
    task gives it on a ``spark_connect_conn_id``."""
    from airflow_transactional.spark.recompute import connect_client_env

    return subprocess.run([sys.executable, application, *args], capture_output=True, text=True, timeout=300,
                          env=connect_client_env(remote, dsn, None, None, os.environ))

#: Another local user's Python: the virtualenv's may sit where ``nobody`` cannot enter.
NOBODY_PYTHON = "/usr/bin/python3"


def as_nobody(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``argv`` run as the local user ``nobody`` (the tests run as root, as CI does), from ``/``."""
    return subprocess.run(argv, capture_output=True, text=True, user="nobody", check=False, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"}, timeout=timeout)


def fetch_blocks_as_nobody(port: int, block_ids: list[str]) -> str:
    """What ``nobody`` gets asking the Spark block manager on 127.0.0.1:``port`` for ``block_ids``
    (``tests/blockfetch.py``: a line per block, ``GOT`` when it got the bytes)."""
    source = (Path(__file__).parent / "blockfetch.py").read_text()
    res = as_nobody([NOBODY_PYTHON, "-c", source, "127.0.0.1", str(port), *block_ids])
    assert res.returncode == 0, res.stderr
    return res.stdout


def listening_ports(pid: int) -> set[int]:
    """The TCP ports the process ``pid`` listens on (its sockets' inodes matched in /proc/net/tcp);
    none once it has ended."""
    inodes, ports = set(), set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
        tables = [Path(f"/proc/{pid}/net/{table}").read_text() for table in ("tcp", "tcp6")]
    except OSError:
        return ports
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


DAG_FILE = """from datetime import timedelta

from airflow_transactional import transactional_dag
from airflow_transactional.spec import TopologySpec

spec = TopologySpec.from_config({config!r})
dag = transactional_dag(spec.topology_id, source=spec.source, states=list(spec.states), outputs=list(spec.outputs),
                        decisions=list(spec.decisions), application={application!r},
                        application_args={args!r}, max_in_flight=spec.max_in_flight,
                        max_batch_size=spec.max_batch_size, opaque=spec.opaque, on_bad_record=spec.on_bad_record,
                        schedule=timedelta(days=1))
"""


def declared(directory: Path, spec: TopologySpec) -> tuple[TopologySpec, str]:
    """``spec`` (with its Spark application, ``spec.job``) as a DAG file declares it, and that file:
    what the owner's ``airflow-txn audit|rebuild --dag-file`` run the topology from."""
    from airflow_transactional.airflow.dagfile import declared_topologies

    assert spec.job is not None
    path = directory / f"{spec.topology_id}_dag.py"
    path.write_text(DAG_FILE.format(config=spec.to_config(), application=spec.job.application,
                                    args=list(spec.job.application_args)))
    [found] = declared_topologies([str(path)])
    return found, str(path)


def query(dsn: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def table(dsn: str, name: str) -> dict[Any, Any]:
    """A state table as {key: value} (single key column)."""
    return {k: v for k, v, *_ in query(dsn, f"SELECT * FROM {name}")}


def counting_topology(topology_id: str = "clicks", *, log: str = "clicks", max_in_flight: int = 3,
                      max_batch_size: int = 50, opaque: bool = False, kind: str = "transactional",
                      on_bad_record: str = "quarantine", max_quarantined: float | None = 0.5) -> TopologySpec:
    """Per-user click counts and a per-user sum of amounts: two states committed together."""
    return TopologySpec(
        topology_id, PostgresLogSource(log),
        [StateSpec(f"{topology_id}_count", {"user_id": "text"}, combiner="count", kind=kind),
         StateSpec(f"{topology_id}_amount", {"user_id": "text"}, combiner="sum", kind=kind)],
        max_in_flight=max_in_flight, max_batch_size=max_batch_size, opaque=opaque,
        on_bad_record=on_bad_record, max_quarantined=max_quarantined)


def click_fn(rec: dict[str, Any]) -> list[tuple[str, tuple[Any, ...], Any]]:
    user = rec["user"]
    amount = int(rec["amount"])
    return [("clicks_count", (user,), 1), ("clicks_amount", (user,), amount)]


def click(i: int, user: str | None = None, amount: int | None = None) -> tuple[str, str]:
    return f"ev-{i}", json.dumps({"user": user or f"u{i % 7}", "amount": i % 11 if amount is None else amount})


#: Payloads that break naive readers: quotes, separators, line ends of every kind, CSV's NULL
#: marker, escapes, padding, non-ASCII, a long one.
AWKWARD_PAYLOADS = ['{"u": "plain"}', "", '{"u": "a \\"quoted\\", comma"}', "tab\there", "new\nline\r\n",
                    "back\\slash", "\\N", "ünïcødé", '""', "  padded  ", "x" * 100_000, "cr\ronly", "\r", "\n",
                    ",", '"', 'a,"b"\n,c']


def make_log(dsn: str, name: str = "clicks", partitions: int = 3) -> EventLog:
    log = EventLog(dsn, name)
    log.create(partitions)
    return log


def run_one(coord: Coordinator, topology_id: str, run_key: str, fn: Any = click_fn) -> int:
    """Plan, process and commit one transaction; return its txid."""
    txn = coord.plan(topology_id, run_key)
    process_batch(coord, topology_id, txn.txid, fn)
    coord.commit(topology_id, txn.txid)
    return txn.txid
