"""Spark's own ports -- a driver's block manager and RPC, a standalone master and its workers --
asking for a secret, and the machine's ``spark-defaults.conf``, where a cluster keeps it.

Without ``spark.authenticate`` any local user fetches a driver's blocks (a task's closure among
them) or runs an application on a standalone master as its workers' user; the Spark Connect token
guards gRPC only. :func:`with_authentication` is applied to every ``spark-submit`` the provider
builds (:func:`.submit.spark_submit_argv`, the process task's), the Spark Connect server's among them.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..exceptions import ConfigError

log = logging.getLogger(__name__)

#: What every driver, Spark Connect server and standalone daemon the provider starts runs with.
#: Without ``spark.authenticate``, a driver's block manager serves its blocks -- a task's closure
#: among them -- to any local user who asks, and a standalone master runs any local user's
#: application as its workers' user. With it, each connection must prove it holds the
#: application's (or the cluster's) secret, and ``spark.network.crypto`` encrypts what crosses it
#: (GCM: authenticated encryption; Spark's default CTR mode is malleable).
SPARK_AUTH_CONF = {"spark.authenticate": "true", "spark.network.crypto.enabled": "true",
                   "spark.network.crypto.cipher": "AES/GCM/NoPadding"}
AUTH_SECRET = "spark.authenticate.secret"
_NO_SECRET_ON_ARGV = ("spark.authenticate.secret", "spark.authenticate.secret.file",
                      "spark.authenticate.secret.driver.file", "spark.authenticate.secret.executor.file")


def with_authentication(conf: Mapping[str, Any], master: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``conf`` with :data:`SPARK_AUTH_CONF` (a user's own cipher wins).

    ``local[N]``, YARN and Kubernetes: Spark makes a new secret for each application and hands it
    to the executors itself. A standalone master (``spark://``) has one secret for the cluster,
    which the master, its workers and every application must share: it is read from
    ``spark-defaults.conf`` (``$SPARK_CONF_DIR`` of ``env``, mode 600), never given here -- a ``--conf`` is
    on the command line, which every local user can read, so one in ``conf`` is refused. A cluster
    without a secret is refused too, naming the fix; ``{"spark.authenticate": "false"}`` runs on
    one anyway (any local user can then read the job's secrets from its driver and run code as
    the workers' user), with a warning in the log.
    """
    check_no_secret_on_argv(conf)
    if str(conf.get("spark.authenticate", "")).strip().lower() == "false":
        log.warning("spark.authenticate is false: any local user can fetch this job's blocks (its closures) from "
                    "the driver and, on a standalone cluster, run code as the workers' user")
        return dict(conf)
    if master.startswith("spark://"):
        check_standalone_secret(master, env)
    return {**SPARK_AUTH_CONF, **{k: v for k, v in conf.items() if k != "spark.authenticate"},
            "spark.authenticate": "true"}


def check_no_secret_on_argv(conf: Mapping[str, Any]) -> None:
    """Refuse Spark's authentication secret (or its file settings) in a job's settings: they would
    be ``--conf`` arguments, on the command line every local user can read."""
    given = sorted(str(k) for k in conf if str(k).strip() in _NO_SECRET_ON_ARGV)
    if given:
        raise ConfigError(f"{given[0]} in spark_conf would be on spark-submit's command line, which every local "
                          "user can read: put it in the cluster's spark-defaults.conf ($SPARK_CONF_DIR, mode 600) "
                          "and leave it out of spark_conf")


def check_standalone_secret(master: str, env: Mapping[str, str] | None = None) -> None:
    """Refuse to submit to the standalone ``master`` unless the ``spark-defaults.conf`` of ``env``
    holds the cluster's secret, in a file only its owner can read."""
    path = spark_defaults_path(env)
    defaults = _properties(path) if path is not None else {}
    fix = (f"put 'spark.authenticate true' and 'spark.authenticate.secret <the cluster's secret>' in the "
           f"spark-defaults.conf of the master, of every worker and of this machine ({path or '$SPARK_CONF_DIR'}), "
           "mode 600, and restart the master and workers; or set spark_conf={'spark.authenticate': 'false'} to run "
           "on an unauthenticated cluster (any local user can then run code as the workers' user)")
    if path is None or not defaults.get(AUTH_SECRET):
        raise ConfigError(f"the standalone master {master} needs the cluster's shared secret: {fix}")
    if os.stat(path).st_mode & 0o077:
        raise ConfigError(f"{path} holds the Spark cluster's secret and other users can read it: chmod 600 {path}")


def spark_defaults_path(env: Mapping[str, str] | None = None) -> Path | None:
    """The ``spark-defaults.conf`` spark-submit reads in ``env`` (default: this process's):
    ``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``, else the pyspark install's ``conf``; None when
    there is none."""
    env = os.environ if env is None else env
    conf_dir = env.get("SPARK_CONF_DIR")
    if not conf_dir:
        home = env.get("SPARK_HOME") or _pyspark_home()
        conf_dir = os.path.join(home, "conf") if home else None
    path = Path(conf_dir or "", "spark-defaults.conf")
    return path if conf_dir and path.is_file() else None


def spark_defaults(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of the ``spark-defaults.conf`` spark-submit reads in ``env``
    (:func:`spark_defaults_path`); empty when there is none."""
    path = spark_defaults_path(env)
    return _properties(path) if path is not None else {}


def _properties(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(errors="replace").splitlines():  # a Java properties file: k v, k=v or k: v
        found = _PROPERTY.match(line.strip())
        if found and not line.strip().startswith(("#", "!")):
            out[found.group(1)] = found.group(2).strip()
    return out


_PROPERTY = re.compile(r"([^=:\s]+)\s*[=:\s]?\s*(.*)")


def _pyspark_home() -> str | None:
    try:
        import pyspark
    except ImportError:
        return None
    return os.path.dirname(pyspark.__file__)
