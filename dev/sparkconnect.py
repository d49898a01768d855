"""A Spark Connect server for the local stack, the tests and the benchmarks: on loopback, serving
only a client that presents its token (the token in its environment, never on a command line),
and holding none of the state store's secrets in its environment."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from airflow_transactional import files
from airflow_transactional.spark.connect_server import (
    spark_connect_server_argv,
    spark_connect_server_env,
    spark_connect_url,
)
from dev.embedded import listening
from dev.faults import KEEP as FAULT_ENV

__all__ = ["ConnectServer"]


class ConnectServer:
    """``start()`` a server on ``port``, wait until it serves, ``stop()`` it; its log goes to ``log``."""

    def __init__(self, port: int, log: Path, *, master: str = "local[2]", token: str | None = None,
                 jars: list[str] | None = None, umask: int = 0o077, conf: dict[str, str] | None = None,
                 credentials: dict[str, str] | None = None) -> None:
        self.port, self.log, self.master = port, log, master
        self.conf = conf or {}
        # What the server reads stores with (AWS_ACCESS_KEY_ID, ...): a Connect client's read carries
        # no secret (airflow_transactional.spark.handoff.reader_options), so the server holds its own.
        self.credentials = credentials or {}
        # Under umask 077 every file the server writes -- the copies of what sessions upload, the
        # state store's DSN among them -- is its own user's alone, whatever the caller's umask.
        self.umask = umask
        self.jars = jars or []  # on the server's classpath: Spark's Kafka connector, for Kafka topologies
        self.token = token or secrets.token_urlsafe(32)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """What a client sets as ``$SPARK_REMOTE`` (it holds the token: an environment value, never argv)."""
        return spark_connect_url(self.port, self.token)

    def connection(self) -> dict[str, Any]:
        """The ``spark_connect`` Airflow connection of this server (its token as the password)."""
        return {"conn_type": "spark_connect", "host": "sc://localhost", "port": self.port, "password": self.token}

    def start(self, env: dict[str, str] | None = None) -> ConnectServer:
        # Its scratch space (Spark's local dirs, the JVM's temp dir, where the server keeps its
        # model cache, the copies of uploaded files) beside its log, not in the system temp
        # directory, and private (mode 700).
        scratch = self.log.parent / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        scratch.chmod(0o777 & ~self.umask)
        base = {**(env if env is not None else os.environ), "PYSPARK_PYTHON": sys.executable,
                "SPARK_LOCAL_IP": "127.0.0.1", "TMPDIR": str(scratch), "SPARK_LOCAL_DIRS": str(scratch),
                "SPARK_SUBMIT_OPTS": f"-Djava.io.tmpdir={scratch}"}
        with open(files.open_private_log(self.log), "ab") as out:
            self.proc = subprocess.Popen(spark_connect_server_argv(self.port, self.master, self.jars, base, self.conf),
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, umask=self.umask,
                                         env={**spark_connect_server_env(self.token, base, keep=FAULT_ENV),
                                              **self.credentials})
        return self

    def wait(self, timeout: float = 180) -> ConnectServer:
        deadline = time.monotonic() + timeout
        while not listening(self.port):
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Spark Connect server did not start; see {self.log}:\n"
                                   + self.log.read_text(errors="replace")[-3000:])
            time.sleep(0.5)
        return self

    def stop(self, timeout: float = 60) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None
