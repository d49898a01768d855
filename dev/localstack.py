"""A real local Airflow 3 for the demo and the end-to-end tests.

Starts the embedded PostgreSQL (Airflow's metadata DB and the state store, as two databases),
then Airflow's api-server, scheduler, dag-processor and triggerer with LocalExecutor, sized for
a small machine. Tasks reach the metadata DB only through the api-server (the Execution API),
so all four run. The REST client talks to the same API the UI uses.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow_transactional import files
from airflow_transactional.spark.connect_server import (
    spark_connect_server_argv,
    spark_connect_server_env,
    spark_connect_url,
)
from airflow_transactional.spark.jars import kafka_connector, s3a_connector
from airflow_transactional.spark.warm import warm_in_child
from dev.embedded import EmbeddedPostgres, free_port, listening
from dev.faults import KEEP as FAULT_ENV
from dev.kafka import KafkaBroker
from dev.restclient import AirflowStackError, RestClient
from dev.s3 import S3Server

log = logging.getLogger(__name__)

# Files the stack's processes create (airflow.cfg with its fernet key, logs) are private from the
# first byte: every process it starts runs under this umask.
UMASK = 0o077

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
SPARK_CONNECT = "spark-connect"  # the optional long-lived Spark (a Spark Connect server)
ADMIN = "admin"
#: A second user with Airflow's read-only Viewer role: sees everything, may change nothing.
VIEWER = "viewer"


def quiet_daily_schedule(now: datetime | None = None) -> str:
    """A daily cron schedule whose next firing is twelve hours from ``now``: unpaused, a DAG on it
    gets the one scheduled run Airflow creates for its latest firing, and no other for the next
    twelve hours. Tests that trigger their own runs and count txids use it; on ``@daily`` a suite
    running across midnight (UTC) got one more scheduled run, and one more txid, than it counted."""
    at = (now or datetime.now(UTC)) + timedelta(hours=12)
    return f"{at.minute} {at.hour} * * *"


def on_schedule(day: datetime, schedule: str) -> datetime:
    """``day`` at the time a daily cron ``schedule`` (``"M H * * *"``, as :func:`quiet_daily_schedule`
    makes) fires: runs triggered at such logical dates are the very runs Airflow's backfill over
    their range finds (a backfill makes its runs at the schedule's times)."""
    minute, hour = schedule.split()[:2]
    return day.replace(hour=int(hour), minute=int(minute), second=0, microsecond=0)


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``argv`` in a session of its own (stopped as a group by :func:`stop_process`), its output
    appended to the private file ``log``, under the stack's umask."""
    with open(files.open_private_log(log), "ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, umask=UMASK)


def stop_process(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Signal the process group ``proc`` leads (each process here starts its own session), and
    reap it; SIGKILL if it outlives ``timeout``."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def _fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


#: How often the stack's Airflow looks again: quicker than Airflow's defaults, for a stack that
#: runs tests and demos.
TIMINGS = {
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
    "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
    # A new or changed DAG file is parsed at once whatever this says; it only spaces out
    # re-parsing unchanged files (a fresh process each, every 30 s by default).
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "300",
    # A task whose worker died (a killed scheduler takes its LocalExecutor workers along)
    # is failed -- and retried -- after one minute instead of five.
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
    # Tasks a dead scheduler had queued are handed back within half a minute of its death,
    # not at the next five-minute sweep.
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30",
    # A task's supervisor that sees the task's sockets close before the process can be reaped
    # sleeps this long before it reports a skipped or failed task and frees its worker (Airflow
    # 3.3's supervisor: a select on no sockets); 5 s by default, 1 s is the least it takes.
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
}


class LocalStack:
    """Embedded Postgres + Airflow (4 components) under ``base_dir``; ``dags_folder`` is served.

    ``parallelism`` caps LocalExecutor's worker processes (Airflow's default of 32 is far too
    many for two cores); the pool ``spark`` (``spark_slots``) caps concurrent ``spark-submit``
    jobs, each of which uses ``local[2]``. ``env`` adds variables for the components and tasks.
    """

    def __init__(self, base_dir: str | os.PathLike[str], dags_folder: str | os.PathLike[str], *,
                 port: int | None = None, parallelism: int = 6, spark_slots: int = 2,
                 env: dict[str, str] | None = None, spark_connect: bool = False,
                 teams: dict[str, str | os.PathLike[str]] | None = None,
                 users: dict[str, str] | None = None, kafka: KafkaBroker | bool = False,
                 s3: bool | S3Server = False, warm_connect: bool = True) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.dags_folder = Path(dags_folder).resolve()
        self.home = self.base_dir / "airflow"
        self.pg = EmbeddedPostgres(self.base_dir / "pg")
        self.port = port or free_port()
        self.parallelism = parallelism
        self.spark_slots = spark_slots
        self.extra_env = dict(env or {})
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # With spark_connect, a Spark Connect server (local[2]) runs beside Airflow as the
        # connection ``spark_connect_default``, for topologies declared with spark_connect_conn_id.
        self.spark_connect_port = free_port() if spark_connect else None
        self.spark_connect_master = "local[2]"
        # Warmed before its first batch (airflow_transactional.spark.warm): a cold server's first
        # batches pay for its JIT. Test stacks, which measure nothing, leave it cold.
        self.warm_connect = warm_connect
        self._secrets_file = self.base_dir / "secrets.json"
        # With teams ({team: dags folder}), Airflow runs in multi-team mode: each folder is a DAG
        # bundle owned by its team, and a user given a team ("viewer:team_a") sees only the DAGs
        # of that team (and of no team).
        self.teams = {name: Path(path).resolve() for name, path in (teams or {}).items()}
        #: user name -> role (and teams, "role:team|team"), for Airflow's simple auth manager
        self.users = {ADMIN: "admin", VIEWER: "viewer", **(users or {})}
        # With kafka, a Kafka broker is Airflow's connection ``kafka_default``: one given (shared, its
        # owner stops it), or True for one the stack starts and stops.
        self.kafka = KafkaBroker(self.base_dir / "kafka") if kafka is True else (kafka or None)
        self._own_kafka = kafka is True
        # With s3, an S3 server (S3Proxy) is Airflow's connection ``aws_default``: True for one of
        # its own, or one given (started and stopped by the stack too).
        self.s3 = S3Server(self.base_dir / "s3") if s3 is True else (s3 or None)

    # -- configuration ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _secrets(self) -> dict[str, str]:
        values = dict(json.loads(self._secrets_file.read_text())) if self._secrets_file.exists() else {}
        wanted = {"jwt": lambda: secrets.token_urlsafe(32), "api": lambda: secrets.token_urlsafe(32),
                  "spark_connect": lambda: secrets.token_urlsafe(32),
                  "fernet": _fernet_key,
                  **{f"{user}_password": lambda: secrets.token_urlsafe(9) for user in self.users}}
        missing = {k: make() for k, make in wanted.items() if k not in values}
        if missing:  # a new stack, or one made before a secret was added
            values.update(missing)
            files.write_private(self._secrets_file, json.dumps(values))
        return values

    @property
    def admin_password(self) -> str:
        return self.password(ADMIN)

    def password(self, user: str) -> str:
        return self._secrets()[f"{user}_password"]

    @property
    def state_dsn(self) -> str:
        return self.pg.dsn("airflow_txn")

    def write_config(self) -> Path:
        """``airflow.cfg`` holding the stack's real settings (mode 600: it holds secrets), so the
        ``airflow`` CLI works with just ``AIRFLOW_HOME`` pointing here."""
        sections: dict[str, list[str]] = {}
        for key, value in sorted(self.env().items()):
            if key.startswith("AIRFLOW__") and key.count("__") >= 2:
                section, option = key[len("AIRFLOW__"):].split("__", 1)
                sections.setdefault(section.lower(), []).append(f"{option.lower()} = {value.replace('%', '%%')}")
        text = "# Written by dev.localstack: the settings the stack runs with.\n"
        text += "".join(f"\n[{name}]\n" + "\n".join(lines) + "\n" for name, lines in sections.items())
        self.home.mkdir(parents=True, exist_ok=True)
        return files.write_private(self.home / "airflow.cfg", text)

    @property
    def scratch_dir(self) -> Path:
        return self.base_dir / "tmp"

    def fresh_scratch(self) -> None:
        """An empty scratch directory for a starting stack: what drivers and tasks killed in an
        earlier life left there (spark-*, blockmgr-*, artifacts-*) belongs to no process now, and
        would pile up across restarts. (A cluster stack's Spark daemons keep theirs apart, under
        its spark/ directory.)"""
        shutil.rmtree(self.scratch_dir, ignore_errors=True)
        self.scratch_dir.mkdir(parents=True)

    def env(self) -> dict[str, str]:
        s = self._secrets()
        store = {"conn_type": "transactional", "host": "127.0.0.1", "port": self.pg.port,
                 "login": "txn_app", "password": self.pg.password, "schema": "airflow_txn"}
        bin_dir = os.path.dirname(sys.executable)
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in self.users.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.base_dir / "passwords.json"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.pg.uri("airflow").replace(
                "postgresql://", "postgresql+psycopg2://"),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__SECRET_KEY": s["api"],
            "AIRFLOW__API_AUTH__JWT_SECRET": s["jwt"],
            "AIRFLOW__CORE__FERNET_KEY": s.get("fernet") or "",
            **TIMINGS,
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.base_dir / "logs"),
            "AIRFLOW_CONN_TRANSACTIONAL_DEFAULT": json.dumps(store),
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "AIRFLOW_TXN_DSN": self.state_dsn,
            "AIRFLOW_TXN_SPARK_POOL": "spark",
            "PYSPARK_PYTHON": sys.executable,
            "NO_PROXY": "*",
            # Scratch files of every component and Spark driver (spark-*, blockmgr-*, artifacts-*)
            # in the stack's own directory: a driver killed mid-batch leaves nothing elsewhere.
            "TMPDIR": str(self.scratch_dir),
            "SPARK_LOCAL_DIRS": str(self.scratch_dir),
            "SPARK_SUBMIT_OPTS": f"-Djava.io.tmpdir={self.scratch_dir}",
            # Drivers' DSN files: one a killed task left goes with the stack, not into ~/.cache.
            "AIRFLOW_TXN_SECRETS_DIR": str(self.scratch_dir / "secrets"),
        }
        if self.kafka is not None:
            env["AIRFLOW_CONN_KAFKA_DEFAULT"] = self.kafka.airflow_connection()
        if self.s3 is not None and self.s3.port:
            env["AIRFLOW_CONN_AWS_DEFAULT"] = self.s3.airflow_connection()
        if self.spark_connect_port:
            # The server serves only a client with its token (localhost: PySpark sends a token over
            # plain loopback only to "localhost"; anywhere else it wants TLS).
            env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = json.dumps(
                {"conn_type": "spark_connect", "host": "sc://localhost", "port": self.spark_connect_port,
                 "password": s["spark_connect"]})
        if self.teams:
            bundle = "airflow.dag_processing.bundles.local.LocalDagBundle"
            env["AIRFLOW__CORE__MULTI_TEAM"] = "True"
            env["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(
                [{"name": "dags-folder", "classpath": bundle, "kwargs": {"path": str(self.dags_folder)}}]
                + [{"name": f"{team}-dags", "classpath": bundle, "kwargs": {"path": str(path)}, "team_name": team}
                   for team, path in self.teams.items()])
        env.update(self.extra_env)
        return env

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float = 240) -> LocalStack:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        (self.base_dir / "logs").mkdir(exist_ok=True)
        self.fresh_scratch()
        self.pg.start()
        if self._own_kafka and self.kafka is not None:
            self.kafka.start()
        if self.s3 is not None:
            self.s3.start()
        self.pg.create_database("airflow")
        self.pg.create_database("airflow_txn")
        files.write_private(self.base_dir / "passwords.json",
                            json.dumps({user: self.password(user) for user in self.users}))
        self.write_config()
        self._run(["airflow", "db", "migrate"], "db-migrate", timeout=600)
        if self.teams:  # the teams the DAG bundles name, before the dag-processor reads them
            self._run(["airflow", "teams", "sync"], "teams", timeout=120)
        self._run(["airflow", "pools", "set", "spark", str(self.spark_slots), "concurrent spark-submit jobs"],
                  "pools", timeout=120)
        for name in self.components:
            if name not in self.on_demand:
                self.start_component(name)
        self.wait_healthy(timeout)
        if SPARK_CONNECT in self.procs:
            self.warm_spark_connect()
        return self

    def warm_spark_connect(self) -> None:
        """Warm the listening Spark Connect server (unless the stack was made with ``warm_connect=False``)."""
        if self.warm_connect and self.spark_connect_port:
            took = warm_in_child(spark_connect_url(self.spark_connect_port, self._secrets()["spark_connect"]))
            log.info("Spark Connect server warmed in %.0f s", sum(took))

    @property
    def components(self) -> tuple[str, ...]:
        return (*COMPONENTS, SPARK_CONNECT) if self.spark_connect_port else COMPONENTS

    @property
    def on_demand(self) -> tuple[str, ...]:
        """Components :meth:`start` leaves to the caller (``start_component``)."""
        return ()

    def _run(self, argv: list[str], label: str, timeout: float) -> None:
        logf = self.base_dir / f"{label}.log"
        with open(files.open_private_log(logf), "wb") as out:
            res = subprocess.run(argv, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, timeout=timeout, check=False, umask=UMASK)
        if res.returncode != 0:
            raise AirflowStackError(f"'{' '.join(argv)}' failed ({res.returncode}); see {logf}:\n"
                                    + logf.read_text()[-3000:])

    def start_component(self, name: str) -> None:
        if name not in self.components:
            raise AirflowStackError(f"unknown component {name!r}: one of {', '.join(self.components)}")
        env = self.env()
        if name == SPARK_CONNECT and self.spark_connect_port:
            connector = [*((kafka_connector().find() or []) if self.kafka is not None else []),
                         *((s3a_connector().find() or []) if self.s3 is not None else [])]
            argv = spark_connect_server_argv(self.spark_connect_port, self.spark_connect_master,
                                             jars=[str(j) for j in connector], env=env)
            env = spark_connect_server_env(self._secrets()["spark_connect"], env, keep=FAULT_ENV)  # none of our secrets
            if self.s3 is not None:  # but the bucket's: a read on Spark Connect carries no credentials
                env.update(self.s3.server_credentials())
        else:
            argv = ["airflow", name] + (["--port", str(self.port)] if name == "api-server" else [])
        self.procs[name] = spawn(argv, self.base_dir / f"{name}.log", env)

    def stop_component(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        stop_process(self.procs.pop(name, None), sig, timeout)

    def stop(self, *, remove: bool = False) -> None:
        """Stop every component; ``remove``: delete the state store's data too (a throwaway stack)."""
        for name in reversed(self.components):
            self.stop_component(name)
        if self._own_kafka and self.kafka is not None:
            self.kafka.stop(remove=remove)
        if self.s3 is not None:
            self.s3.stop(remove=remove)
        if remove:
            self.pg.remove()
        else:
            self.pg.stop()
        shutil.rmtree(self.scratch_dir / "secrets", ignore_errors=True)  # no driver runs now

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_healthy(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    tail = (self.base_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise AirflowStackError(f"airflow {name} exited ({proc.returncode}); log tail:\n{tail}")
            try:
                health = self.client().get("/api/v2/monitor/health")
                if all(health.get(c, {}).get("status") == "healthy"
                       for c in ("metadatabase", "scheduler", "triggerer", "dag_processor")) and (
                        SPARK_CONNECT not in self.procs or listening(self.spark_connect_port or 0)):
                    return
                last = json.dumps(health)
            except (OSError, AirflowStackError) as exc:
                last = str(exc)
            time.sleep(2)
        raise AirflowStackError(f"Airflow did not become healthy in {timeout:.0f}s: {last}")

    def client(self, user: str = ADMIN) -> RestClient:
        """A REST client signed in as ``user``: the admin, ``VIEWER`` (Airflow's read-only role)
        or one of ``users``."""
        return RestClient(self.url, user, self.password(user))

    def remove(self) -> None:
        """Delete everything under ``base_dir`` (stop first)."""
        shutil.rmtree(self.base_dir, ignore_errors=True)
