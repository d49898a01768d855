"""The engines a team runs beyond one machine, started here on one: Airflow with CeleryExecutor
(Debian's ``redis-server`` as broker, two Celery workers) and Spark on a standalone cluster (a
master and workers started from the pinned pyspark install with ``spark-class``).

:class:`ClusterStack` is :class:`~dev.localstack.LocalStack` with those engines: the same
embedded Postgres, api-server, scheduler, dag-processor and triggerer, but tasks run in Celery
workers, and ``spark_default`` names the standalone master (client deploy mode: the driver runs in
the Celery worker that runs the process task, its executors on the Spark workers). Everything
listens on loopback only and lives under the stack's directory; ``stop(remove=True)`` leaves
nothing behind.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from airflow_transactional import files
from airflow_transactional.spark.auth import AUTH_SECRET, SPARK_AUTH_CONF
from dev.embedded import free_port, listening
from dev.localstack import SPARK_CONNECT, LocalStack, spawn, stop_process
from dev.restclient import AirflowStackError

REDIS_SERVER = "redis-server"
REDIS_FIX = "the cluster stack's Celery broker is Debian's redis-server: apt-get install redis-server"


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (read from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            child, ppid = int(stat.parent.name), int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(child)
    found, queue = [], [pid]
    while queue:
        found.append(queue.pop(0))
        queue.extend(children.get(found[-1], []))
    return found


def kill_tree(pid: int) -> None:
    """A host lost: ``pid`` and everything it started, SIGKILLed at once (sessions and process
    groups of their own included: a task's ``spark-submit`` driver dies with its worker)."""
    for each in descendants(pid):
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _wait(ready: Any, what: str, log: Path, proc: subprocess.Popen[bytes] | None, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise AirflowStackError(f"{what} exited ({proc.returncode}); {log}:\n"
                                    + log.read_text(errors="replace")[-2000:])
        if time.monotonic() > deadline:
            raise AirflowStackError(f"{what} not ready after {timeout:.0f}s; {log}:\n"
                                    + log.read_text(errors="replace")[-2000:])
        time.sleep(0.5)


class RedisServer:
    """Debian's ``redis-server`` on a free loopback port, with a password, its files (config, the
    append-only log that keeps queued messages over a restart) under ``base_dir``."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def password(self) -> str:
        secret = self.base_dir / "password"
        if not secret.exists():
            self.base_dir.mkdir(parents=True, exist_ok=True)
            files.write_private(secret, secrets.token_urlsafe(24))
        return secret.read_text()

    def url(self, db: int = 0) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/{db}"

    def start(self) -> RedisServer:
        binary = shutil.which(REDIS_SERVER)
        if binary is None:
            raise AirflowStackError(f"{REDIS_SERVER} not found: {REDIS_FIX}")
        conf = files.write_private(self.base_dir / "redis.conf", "\n".join([
            "bind 127.0.0.1", "protected-mode yes", f"port {self.port}", f"requirepass {self.password}",
            f"dir {self.base_dir}", "appendonly yes", 'save ""', "daemonize no", "loglevel notice", ""]))
        self.proc = spawn([binary, str(conf)], self.base_dir / "redis.log")
        _wait(lambda: listening(self.port), REDIS_SERVER, self.base_dir / "redis.log", self.proc)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        stop_process(self.proc, sig)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


#: What the stack's standalone cluster runs with besides its secret: Spark's authentication and
#: encryption (:data:`~airflow_transactional.spark.submit.SPARK_AUTH_CONF`), no REST submission
#: port (it takes applications over HTTP, outside the RPC's authentication), and no kill buttons on
#: the master's and workers' web pages (which have no login).
SECURED = {**SPARK_AUTH_CONF, "spark.master.rest.enabled": "false", "spark.ui.killEnabled": "false"}


class SparkStandalone:
    """A Spark standalone master and ``workers`` workers of ``cores`` cores each, on loopback, their
    logs and work directories under ``base_dir``. ``conf`` goes to the cluster's
    ``spark-defaults.conf``, which every ``spark-submit`` of the stack and the daemons read
    (SPARK_CONF_DIR).

    The master keeps its applications and workers in a recovery directory
    (``spark.deploy.recoveryMode=FILESYSTEM``), as a production master should: restarted, it
    recovers them, and a driver under way -- a batch's, or a Spark Connect server's -- goes on. A
    master without recovery forgets them: its workers register again, but a driver running at the
    restart waits for executors for ever ("Disconnected from Spark cluster! Waiting for
    reconnection..."), and a Spark Connect server runs no batch again until it is restarted.
    ``recovery=False`` starts such a master."""

    def __init__(self, base_dir: Path, workers: int = 2, cores: int = 1, memory: str = "2g",
                 conf: dict[str, str] | None = None, recovery: bool = True) -> None:
        self.base_dir = base_dir
        self.port = free_port()
        self.cores, self.memory = cores, memory
        self.workers: dict[int, subprocess.Popen[bytes] | None] = dict.fromkeys(range(1, workers + 1))
        self.master: subprocess.Popen[bytes] | None = None
        self.recovery = recovery
        # The cluster's shared secret (SECURED): the master accepts only applications, and workers,
        # that hold it; without it any local user ran applications here, as the workers' user.
        self.conf = {**SECURED,
                     **({"spark.deploy.recoveryMode": "FILESYSTEM",
                         "spark.deploy.recoveryDirectory": str(base_dir / "recovery")} if recovery else {}),
                     **(conf or {})}

    @property
    def secret(self) -> str:
        """The cluster's shared secret, made once and kept (0600) beside its daemons' files."""
        kept = self.base_dir / "secret"
        if not kept.exists():
            files.private_dir(self.base_dir)
            files.write_private(kept, secrets.token_hex(32))
        return kept.read_text()

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def conf_dir(self) -> Path:
        return self.base_dir / "conf"

    def env(self) -> dict[str, str]:
        # The executors' scratch directories (a worker's SPARK_LOCAL_DIRS overrides spark.local.dir)
        # in the cluster's own directory: what a killed worker leaves goes with the stack.
        scratch = self.base_dir / "tmp"
        scratch.mkdir(parents=True, exist_ok=True)
        return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
                "SPARK_CONF_DIR": str(self.conf_dir), "SPARK_LOG_DIR": str(self.base_dir),
                "SPARK_LOCAL_DIRS": str(scratch), "TMPDIR": str(scratch),
                "SPARK_DAEMON_JAVA_OPTS": f"-Djava.io.tmpdir={scratch}"}

    def start(self) -> SparkStandalone:
        # Read by the daemons and by every spark-submit of the stack; it holds the secret: 0600.
        settings = {**self.conf, AUTH_SECRET: self.secret}
        files.write_private(files.private_dir(self.conf_dir) / "spark-defaults.conf",
                            "".join(f"{k} {v}\n" for k, v in sorted(settings.items())))
        self.start_master()
        for k in self.workers:
            self.start_worker(k)
        return self

    def start_master(self) -> None:
        log = self.base_dir / "master.log"
        self.master = spawn(["spark-class", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                              "--port", str(self.port), "--webui-port", str(free_port())], log, self.env())
        _wait(lambda: listening(self.port), "the Spark master", log, self.master)

    def restart_master(self, *, forget: bool = False) -> None:
        """The master stopped and started again on its port: until it has recovered its workers and
        applications (or, without recovery, until every live worker has registered again).
        ``forget``: its recovery directory emptied first -- it starts knowing nothing, as a master
        without a recovery mode does."""
        log = self.base_dir / "master.log"
        ready = "Recovery complete" if self.recovery and not forget else "Registering worker"
        seen = log.read_text(errors="replace").count(ready)
        stop_process(self.master)
        if forget:
            shutil.rmtree(self.base_dir / "recovery", ignore_errors=True)
        self.start_master()
        live = sum(proc is not None and proc.poll() is None for proc in self.workers.values())
        want = seen + live if ready == "Registering worker" else seen + 1
        _wait(lambda: log.read_text(errors="replace").count(ready) >= want,
              "the restarted master's recovery of its workers and applications", log, self.master, timeout=120)

    def start_worker(self, k: int) -> None:
        log = self.base_dir / f"worker-{k}.log"
        seen = log.read_text(errors="replace").count("Successfully registered") if log.exists() else 0
        self.workers[k] = spawn(
            ["spark-class", "org.apache.spark.deploy.worker.Worker", self.url, "--cores", str(self.cores),
             "--memory", self.memory, "--host", "127.0.0.1", "--webui-port", str(free_port()),
             "--work-dir", str(self.base_dir / f"work-{k}")], log, self.env())
        _wait(lambda: log.read_text(errors="replace").count("Successfully registered") > seen,
              f"Spark worker {k}", log, self.workers[k])

    def kill_worker(self, k: int) -> None:
        """A Spark worker's host lost: its daemon and the executors it launched, SIGKILLed."""
        proc = self.workers[k]
        if proc is not None:
            kill_tree(proc.pid)
            proc.wait(10)
        self.workers[k] = None

    def executors(self) -> dict[int, int]:
        """Spark worker -> how many executors it runs now."""
        return {k: sum("CoarseGrainedExecutorBackend" in _cmdline(pid) for pid in descendants(proc.pid)[1:])
                for k, proc in self.workers.items() if proc is not None and proc.poll() is None}

    def tasks_started(self) -> int:
        """How many tasks the executors of every application have started so far (their logs)."""
        return sum(log.read_text(errors="replace").count("Running task ")
                   for log in self.base_dir.glob("work-*/app-*/*/stderr"))

    def stop(self) -> None:
        for k in self.workers:
            stop_process(self.workers[k])
            self.workers[k] = None
        stop_process(self.master)
        self.master = None


class ClusterStack(LocalStack):
    """:class:`LocalStack` on CeleryExecutor (Redis, ``celery_workers`` workers) and a Spark
    standalone cluster as ``spark_default``. Each Celery worker is a component of its own
    (``worker-1``, ...), with its own Celery hostname and log-server port."""

    def __init__(self, base_dir: str | os.PathLike[str], dags_folder: str | os.PathLike[str], *,
                 celery_workers: int = 2, worker_concurrency: int = 3, spark_workers: int = 2,
                 **kwargs: Any) -> None:
        super().__init__(base_dir, dags_folder, **kwargs)
        self.redis = RedisServer(self.base_dir / "redis")
        # One core per application: two batches share the two one-core workers instead of the
        # first taking every core and the second waiting for it (a cluster's usual default).
        self.spark = SparkStandalone(self.base_dir / "spark", workers=spark_workers, conf={
            "spark.cores.max": "1", "spark.executor.memory": "1g", "spark.ui.enabled": "false"})
        # With spark_connect, the Spark Connect server is an application of this cluster (its driver
        # here, its executor on a worker), started on demand: its executor holds a worker's core.
        self.spark_connect_master = self.spark.url
        self.celery_workers = [f"worker-{k}" for k in range(1, celery_workers + 1)]
        self.worker_concurrency = worker_concurrency
        self.log_ports = {name: free_port() for name in self.celery_workers}
        self._ready_before: dict[str, int] = {}

    @property
    def components(self) -> tuple[str, ...]:
        return (*super().components, *self.celery_workers)

    @property
    def on_demand(self) -> tuple[str, ...]:
        return (SPARK_CONNECT,) if self.spark_connect_port else ()

    def start_spark_connect(self) -> None:
        """Start the Spark Connect server on the cluster, until it serves."""
        self.start_component(SPARK_CONNECT)
        _wait(lambda: listening(self.spark_connect_port or 0), "the Spark Connect server",
              self.base_dir / f"{SPARK_CONNECT}.log", self.procs[SPARK_CONNECT], timeout=180)
        self.warm_spark_connect()

    def kill_spark_connect(self) -> None:
        """The Spark Connect server's host lost: its JVM (the driver of its sessions) SIGKILLed;
        the master then removes its executors."""
        proc = self.procs.pop(SPARK_CONNECT)
        kill_tree(proc.pid)
        proc.wait(10)

    def env(self) -> dict[str, str]:
        env = super().env()
        host, port = self.spark.url.rsplit(":", 1)
        env.update({
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": self.redis.url(0),
            # Task states in the metadata database, not in Redis: the scheduler reads them at every
            # heartbeat, and a read that fails (the broker restarting) ends the scheduler. With the
            # broker alone in Redis, a restart of it costs a send at most, which Airflow retries.
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + self.pg.uri("airflow").replace(
                "postgresql://", "postgresql+psycopg2://"),
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.worker_concurrency),
            # A task whose worker's host died is failed, and retried on another worker, 30 s after
            # its last heartbeat (Airflow's default, 300 s, is the production value: a busy
            # worker's heartbeats may lag, and a false timeout kills a healthy task).
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
            # A driver its Spark master forgot is killed, and its task retried, 30 s after it lost
            # the master (the provider's default, 120 s, leaves a standby master time to take over).
            "AIRFLOW__TRANSACTIONAL__MASTER_LOST_TIMEOUT": "30",
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": host, "port": int(port)}),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_CONF_DIR": str(self.spark.conf_dir),
        })
        return env

    def start(self, timeout: float = 240) -> ClusterStack:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.redis.start()
        self.spark.start()
        super().start(timeout)
        for name in self.celery_workers:
            self.wait_worker(name)
        return self

    def start_component(self, name: str) -> None:
        if name not in self.celery_workers:
            super().start_component(name)
            return
        env = {**self.env(), "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.log_ports[name])}
        self._ready_before[name] = self._ready_count(name)
        self.procs[name] = spawn(["airflow", "celery", "worker", "--celery-hostname", f"{name}@%h",
                                   "--concurrency", str(self.worker_concurrency),
                                   "--pid", str(self.base_dir / f"{name}.pid")],  # one pid file each
                                  self.base_dir / f"{name}.log", env)

    def wait_worker(self, name: str, timeout: float = 120) -> None:
        """Until the Celery worker ``name``, (re)started, says it is ready."""
        before = self._ready_before.get(name, 0)
        _wait(lambda: self._ready_count(name) > before, f"Celery {name}", self.base_dir / f"{name}.log",
              self.procs.get(name), timeout)

    def _ready_count(self, name: str) -> int:
        log = self.base_dir / f"{name}.log"
        return log.read_text(errors="replace").count(" ready.") if log.exists() else 0

    def worker_of(self, pid: int) -> str | None:
        """The Celery worker whose process tree holds ``pid`` (a task's), or None."""
        return next((name for name in self.celery_workers
                     if name in self.procs and pid in descendants(self.procs[name].pid)), None)

    def kill_worker(self, name: str) -> None:
        """The host of the Celery worker (or other component) ``name`` lost: the worker, its pool,
        the tasks they run and the Spark drivers those started -- or the triggerer and its trigger
        runner -- SIGKILLed at once. ``start_component(name)`` brings up a replacement."""
        proc = self.procs.pop(name)
        kill_tree(proc.pid)
        proc.wait(10)

    def stop(self, *, remove: bool = False) -> None:
        try:
            super().stop(remove=remove)
        finally:
            self.spark.stop()
            self.redis.stop()
            if remove:
                shutil.rmtree(self.spark.base_dir, ignore_errors=True)
                shutil.rmtree(self.redis.base_dir, ignore_errors=True)
