"""A Spark Connect server started by this machine (the demo's, the tests', the benchmarks'): its
``spark-submit`` argv, the environment it may keep (no secret of its starter's), and a client's URL."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..exceptions import ConfigError
from .submit import LOCAL_SPARK_CONF, spark_submit_argv, with_quiet_driver_logs

SPARK_CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: Where a Spark Connect server (and a client) takes its shared token: never on a command line.
CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"


#: What a Spark Connect server keeps of its starter's environment: what Java, Spark and Python
#: need to run, by name or prefix. Nothing else -- an authenticated client can run code in the
#: server and read its environment, so a secret of the starter's must not pass by accident.
CONNECT_SERVER_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "JAVA_HOME",
                                "PYTHONPATH", "PYTHONHASHSEED", "HADOOP_CONF_DIR", "HADOOP_HOME", "YARN_CONF_DIR",
                                "XDG_CACHE_HOME", "NO_PROXY", "AIRFLOW_TXN_CACHE_DIR",
                                # Spark's and PySpark's own settings, each by name: a prefix would let
                                # SPARK_ANYTHING_SECRET through to a server any client may read.
                                "SPARK_HOME", "SPARK_CONF_DIR", "SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME",
                                "SPARK_LOCAL_DIRS", "SPARK_LOG_DIR", "SPARK_PID_DIR", "SPARK_SUBMIT_OPTS",
                                "SPARK_DAEMON_JAVA_OPTS", "SPARK_DAEMON_MEMORY", "SPARK_DRIVER_MEMORY",
                                "SPARK_PUBLIC_DNS", "SPARK_SCALA_VERSION", "SPARK_DIST_CLASSPATH",
                                "SPARK_NICENESS", "SPARK_IDENT_STRING", "SPARK_NO_DAEMONIZE",
                                "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"})
#: Variables kept by prefix: the locale's and the native math library's settings (no secret there).
CONNECT_SERVER_ENV_PREFIXES = ("LC_", "OPENBLAS_")


def spark_connect_server_env(token: str, base: Mapping[str, str] | None = None, *,
                             keep: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of a Spark Connect server: of ``base`` (default: this process's) only what
    :data:`CONNECT_SERVER_ENV` names (and ``keep``), with the token every client must present
    (``spark.connect.authenticate.token`` is the same setting, but on the server's command line
    every local user could read it)."""
    if not token:
        raise ConfigError("a Spark Connect server needs a token: without one any local user may run code in it")
    allowed = CONNECT_SERVER_ENV | set(keep)
    return {**{k: v for k, v in (base if base is not None else os.environ).items()
               if k in allowed or k.startswith(CONNECT_SERVER_ENV_PREFIXES)}, CONNECT_TOKEN_ENV: token}


def spark_connect_url(port: int, token: str) -> str:
    """A client's URL for a token-checking server on this machine: ``localhost`` (not 127.0.0.1)
    is what lets PySpark's client send a token over plain loopback instead of requiring TLS."""
    return f"sc://localhost:{port}/;token={token}"


def spark_connect_server_argv(port: int, master: str = "local[2]", jars: list[str] | None = None,
                              env: Mapping[str, str] | None = None, conf: Mapping[str, str] | None = None) -> list[str]:
    """``spark-submit`` of a Spark Connect server on 127.0.0.1:``port`` (Spark ships the server),
    with ``jars`` on its classpath (Spark's Kafka connector, for Kafka topologies), to run in
    ``env``, and ``conf`` besides. Start it with :func:`spark_connect_server_env`: a server without a
    token serves any local user (the token guards its gRPC port; Spark's authentication, its block
    manager)."""
    conf = with_quiet_driver_logs({**LOCAL_SPARK_CONF, "spark.driver.memory": "2g",
                                   # a long-lived JVM: let the JIT optimise fully
                                   "spark.driver.extraJavaOptions": "-XX:+UseSerialGC",
                                   "spark.connect.grpc.binding.address": "127.0.0.1",
                                   "spark.connect.grpc.binding.port": str(port),
                                   **({"spark.jars": ",".join(jars)} if jars else {}), **(conf or {})})
    return [*spark_submit_argv(master, conf, "--class", SPARK_CONNECT_SERVER, "--name", "spark-connect", env=env),
            "spark-internal"]
