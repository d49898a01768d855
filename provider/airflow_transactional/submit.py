"""How the state store's DSN reaches a Spark driver: never on a command line, never in a pod spec.

``spark-submit`` arguments show in ``ps`` on the submitting machine, and the Apache Spark
provider turns ``env_vars`` into ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*``
arguments for YARN and Kubernetes masters (and refuses them outright for a standalone master in
cluster mode). So the DSN travels the way each cluster manager keeps a secret:

* a driver on this machine (``local[N]``, and any master in client mode): a file readable only
  by this user, written for the one job and removed after it; the driver gets its *path*
  (``--dsn-file``);
* YARN, cluster mode: the same file shipped with ``--files``; YARN localizes it into the
  application's private container directory, where the driver reads it by name;
* Kubernetes, cluster mode: a Kubernetes secret the operator names (``kubernetes_dsn_secret=
  "name:key"``), mounted into the driver's environment by reference
  (``spark.kubernetes.driver.secretKeyRef``); the DSN itself never leaves the secret;
* a standalone master in cluster mode: the file, at a path the worker that starts the driver can
  read -- put ``AIRFLOW_TXN_CACHE_DIR`` on storage the workers share, as the application is.

Executors never need the file: the driver hands them the DSN inside the tasks it ships.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import files
from .exceptions import ConfigError

DSN_ENV = "AIRFLOW_TXN_DSN"
DSN_FILE_ENV = "AIRFLOW_TXN_DSN_FILE"
DSN_FILE_ARG = "--dsn-file"
#: The name YARN gives the shipped DSN file in the driver's container.
YARN_DSN_NAME = "airflow_txn_dsn"
K8S_SECRET_CONF = f"spark.kubernetes.driver.secretKeyRef.{DSN_ENV}"
_K8S_SECRET_REF = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?:[-._a-zA-Z0-9]+")


@dataclass(frozen=True)
class DsnDelivery:
    """What one ``spark-submit`` adds to carry the DSN: application arguments, ``--files``
    entries and ``--conf`` settings (none of them secret), and the local file to remove after."""

    app_args: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    conf: dict[str, str] = field(default_factory=dict)
    local_file: Path | None = None

    def remove(self) -> None:
        if self.local_file is not None:
            self.local_file.unlink(missing_ok=True)


def write_dsn_file(dsn: str) -> Path:
    """A new file, mode 0600 from creation, holding ``dsn``, in the provider's private directory."""
    home = files.private_dir(files.cache_dir() / "dsn")
    fd, name = tempfile.mkstemp(prefix="dsn-", dir=home)  # 0600
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(dsn)
    return Path(name)


def deliver_dsn(dsn: str, master: str, deploy_mode: str | None, *,
                kubernetes_dsn_secret: str | None = None) -> DsnDelivery:
    """How the DSN reaches a driver of ``master`` in ``deploy_mode`` (see the module docstring)."""
    cluster = deploy_mode == "cluster"
    if master.startswith("k8s://") and cluster:
        if not kubernetes_dsn_secret:
            raise ConfigError("a k8s:// master in cluster mode needs the DSN in a Kubernetes secret: create one "
                              "(kubectl create secret generic txn-store --from-literal=dsn='postgresql://...') "
                              "and pass kubernetes_dsn_secret='txn-store:dsn'")
        if not _K8S_SECRET_REF.fullmatch(kubernetes_dsn_secret):
            raise ConfigError(f"kubernetes_dsn_secret must be 'secret-name:key', got {kubernetes_dsn_secret!r}")
        return DsnDelivery(conf={K8S_SECRET_CONF: kubernetes_dsn_secret})
    path = write_dsn_file(dsn)
    if master.startswith("yarn") and cluster:
        return DsnDelivery([DSN_FILE_ARG, YARN_DSN_NAME], [f"{path}#{YARN_DSN_NAME}"], local_file=path)
    return DsnDelivery([DSN_FILE_ARG, str(path)], local_file=path)


def driver_dsn(dsn_file: str | None) -> str:
    """The DSN inside a driver: ``--dsn-file``, else ``$AIRFLOW_TXN_DSN_FILE``, else ``$AIRFLOW_TXN_DSN``."""
    path = dsn_file or os.environ.get(DSN_FILE_ENV)
    if path:
        try:
            dsn = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"the driver cannot read the DSN file {path}: {exc.strerror} (a standalone master "
                              "in cluster mode needs AIRFLOW_TXN_CACHE_DIR on storage its workers share)") from None
        if dsn:
            return dsn
        raise ConfigError(f"the DSN file {path} is empty")
    from_env = os.environ.get(DSN_ENV)
    if not from_env:
        raise ConfigError(f"no state store DSN: the processing operator passes {DSN_FILE_ARG}; when running a job "
                          f"by hand set ${DSN_ENV} or ${DSN_FILE_ENV}")
    return from_env
