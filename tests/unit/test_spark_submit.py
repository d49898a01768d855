"""The exact ``spark-submit`` command of the process task for each kind of master, as the Apache
Spark provider's hook builds it: the state store's DSN is never in it, nor in a ``--conf`` that
would put it in a pod spec or a YARN app master's environment."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_transactional.airflow.operators import TransactionalSparkSubmitOperator
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.spark import submit as spark_job
from airflow_transactional.spark.submit import driver_dsn

pytestmark = pytest.mark.unit

DSN = "host=db.internal port=5432 dbname=txn user=app password=s3cret"
#: What every driver's command line carries: Spark's own ports ask for the application's secret.
AUTH = ["--conf", "spark.authenticate=true", "--conf", "spark.network.crypto.enabled=true",
        "--conf", "spark.network.crypto.cipher=AES/GCM/NoPadding"]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("AIRFLOW_TXN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_TXN_SPARK_CDS", "off")
    monkeypatch.setenv("PYSPARK_PYTHON", "/venv/bin/python")
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    # The hook wants the Kubernetes provider for a k8s:// master only to track the driver later.
    import airflow.providers.apache.spark.hooks.spark_submit as hook_module
    monkeypatch.setattr(hook_module, "kube_client", object(), raising=False)
    yield tmp_path


def submit(monkeypatch: pytest.MonkeyPatch, conn: dict[str, object], deploy_mode: str | None,
           **kwargs: object) -> tuple[list[str], dict[str, str] | None, Path | None]:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", json.dumps({"conn_type": "spark", **conn}))
    op = TransactionalSparkSubmitOperator(task_id="process", topology={"topology_id": "t"}, application="/jobs/w.py",
                                          conn_id="spark_test", deploy_mode=deploy_mode, name="txn-t", **kwargs)
    delivery = op.prepare_submit(7, "airflow_txn", DSN)
    hook = op._get_hook()
    argv = hook._build_spark_submit_command(op.application)
    assert not any("s3cret" in a or "db.internal" in a for a in argv)
    assert "s3cret" not in json.dumps(hook._env or {})
    return argv, hook._env, delivery.local_file


def cluster_secret(monkeypatch: pytest.MonkeyPatch, conf_dir: Path, mode: int = 0o600) -> Path:
    """A standalone cluster's ``spark-defaults.conf`` on this machine, holding its secret."""
    path = conf_dir / "spark-defaults.conf"
    path.write_text("spark.authenticate true\nspark.authenticate.secret hunter2\n")
    path.chmod(mode)
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    return path


def job_args(dsn_file: str) -> list[str]:
    return ["/jobs/w.py", "--topology", "t", "--txid", "7", "--schema", "airflow_txn", "--dsn-file", dsn_file]


def test_a_local_driver_reads_the_dsn_from_a_private_file(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    argv, env, dsn_file = submit(monkeypatch, {"host": "local[2]"}, None)
    assert dsn_file is not None and dsn_file.parent == cache / "dsn"
    assert argv == ["spark-submit", "--master", "local[2]", *AUTH, "--conf",
                    f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=file:{spark_job.quiet_log_config()}",
                    "--py-files", spark_job.provider_zip(), "--name", "txn-t", *job_args(str(dsn_file))]
    assert env == {"PYSPARK_PYTHON": "/venv/bin/python", "SPARK_LOCAL_IP": "127.0.0.1"}
    assert stat.S_IMODE(os.stat(dsn_file).st_mode) == 0o600 and driver_dsn(str(dsn_file)) == DSN


def test_a_standalone_master_in_client_and_cluster_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cluster_secret(monkeypatch, tmp_path)
    argv, env, dsn_file = submit(monkeypatch, {"host": "spark://h", "port": 7077}, "client")
    assert argv[:3 + len(AUTH)] == ["spark-submit", "--master", "spark://h:7077", *AUTH]
    assert not any("hunter2" in a for a in argv)  # the cluster's secret: spark-submit reads it from the file
    assert argv[-11:] == ["--deploy-mode", "client", *job_args(str(dsn_file))]
    # Not loopback: the executors on the cluster's other hosts connect back to the driver here.
    assert env == {"PYSPARK_PYTHON": "/venv/bin/python"}
    # Cluster mode: Spark refuses a Python application there (tests/cluster/test_deploy_modes.py
    # shows it on a real master), so the task does first, naming the fix -- from the connection or the conf.
    with pytest.raises(ConfigError, match=r"standalone master \(spark://h:7077\) runs Python applications in "
                       "client mode only: set deploy-mode to client in the Spark connection"):
        submit(monkeypatch, {"host": "spark://h", "port": 7077}, "cluster")
    with pytest.raises(ConfigError, match="client mode only"):
        submit(monkeypatch, {"host": "spark://h", "port": 7077}, None, conf={"spark.submit.deployMode": "cluster"})


def test_yarn_cluster_mode_ships_the_file_yarn_keeps_private(monkeypatch: pytest.MonkeyPatch) -> None:
    argv, env, dsn_file = submit(monkeypatch, {"host": "yarn"}, "cluster")
    assert argv == ["spark-submit", "--master", "yarn", *AUTH, "--files", f"{dsn_file}#airflow_txn_dsn",
                    "--py-files", spark_job.provider_zip(), "--name", "txn-t", "--deploy-mode", "cluster",
                    *job_args("airflow_txn_dsn")]
    assert env is None


def test_yarn_client_mode_keeps_the_driver_here(monkeypatch: pytest.MonkeyPatch) -> None:
    argv, env, dsn_file = submit(monkeypatch, {"host": "yarn"}, "client")
    assert argv[-9:] == job_args(str(dsn_file))
    assert "--files" not in argv and env == {"PYSPARK_PYTHON": "/venv/bin/python"}


@pytest.mark.parametrize("deploy_mode", ["cluster", "client"])
def test_a_verify_rounds_request_travels_as_the_dsn_does(monkeypatch: pytest.MonkeyPatch, deploy_mode: str) -> None:
    # One resolution of the Spark connection gives the DSN file and the round's request their way
    # to the driver: beside a cluster-mode driver (--files), or its path for a driver here.
    from airflow_transactional.airflow.operators.verify import VerifyOperator
    from airflow_transactional.coordinator import VerificationRound, from_request
    from airflow_transactional.spark.recompute import RECOMPUTE_ARG, SHIPPED_REQUEST

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", json.dumps({"conn_type": "spark", "host": "yarn"}))
    op = VerifyOperator(task_id="verify", topology={"topology_id": "t"}, application="/jobs/w.py",
                        conn_id="spark_test", deploy_mode=deploy_mode, name="txn-t", verify_round="5:2")
    op._round = VerificationRound("t", 5, 2)
    delivery = op.prepare_submit(0, "airflow_txn", DSN)
    request = op._request.local_file
    try:
        assert request is not None and stat.S_IMODE(os.stat(request).st_mode) == 0o600
        assert from_request(json.loads(request.read_text())) == VerificationRound("t", 5, 2)
        argv = op._get_hook()._build_spark_submit_command(op.application)
        given = argv[argv.index(RECOMPUTE_ARG) + 1]
        if deploy_mode == "cluster":
            files = argv[argv.index("--files") + 1].split(",")
            assert given == SHIPPED_REQUEST and f"{request}#{SHIPPED_REQUEST}" in files
            assert f"{delivery.local_file}#airflow_txn_dsn" in files
        else:
            assert given == str(request) and "--files" not in argv
    finally:
        delivery.remove()
        op._request.remove()
    assert not request.exists()


def test_kubernetes_cluster_mode_names_a_secret_and_never_carries_the_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    upload = {"spark.kubernetes.file.upload.path": "s3a://jobs/uploads"}
    argv, env, dsn_file = submit(monkeypatch, {"host": "k8s://https://k:443"}, "cluster",
                                 kubernetes_dsn_secret="txn-store:dsn", conf=upload)
    assert dsn_file is None and env is None
    assert argv == ["spark-submit", "--master", "k8s://https://k:443", *AUTH, "--conf",
                    "spark.kubernetes.file.upload.path=s3a://jobs/uploads", "--conf",
                    "spark.kubernetes.driver.secretKeyRef.AIRFLOW_TXN_DSN=txn-store:dsn",
                    "--py-files", spark_job.provider_zip(), "--name", "txn-t", "--deploy-mode", "cluster",
                    "/jobs/w.py", "--topology", "t", "--txid", "7", "--schema", "airflow_txn"]
    with pytest.raises(ConfigError, match="kubernetes_dsn_secret='txn-store:dsn'"):
        submit(monkeypatch, {"host": "k8s://https://k:443"}, "cluster", conf=upload)
    with pytest.raises(ConfigError, match="'secret-name:key'"):
        submit(monkeypatch, {"host": "k8s://https://k:443"}, "cluster", kubernetes_dsn_secret="no key", conf=upload)


def test_kubernetes_cluster_mode_needs_an_upload_path_for_the_job_and_the_provider(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Spark would start a JVM, then stop: "Please specify spark.kubernetes.file.upload.path property."
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match=r"spark_conf=\{'spark.kubernetes.file.upload.path': 's3a://"):
        submit(monkeypatch, {"host": "k8s://https://k:443"}, "cluster", kubernetes_dsn_secret="txn-store:dsn")
    # The cluster's spark-defaults.conf (a Java properties file) may set it instead.
    (tmp_path / "spark-defaults.conf").write_text("# uploads\nspark.kubernetes.file.upload.path=s3a://jobs/up\n")
    argv, _env, _file = submit(monkeypatch, {"host": "k8s://https://k:443"}, "cluster",
                               kubernetes_dsn_secret="txn-store:dsn")
    assert "spark.kubernetes.file.upload.path=s3a://jobs/up" not in argv  # spark-submit reads the file itself
    # Client mode (the driver in the task's pod) reads the job where it is.
    argv, _env, dsn_file = submit(monkeypatch, {"host": "k8s://https://k:443"}, None)
    assert dsn_file is not None and "--deploy-mode" not in argv


def test_the_driver_refuses_a_missing_dsn_naming_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AIRFLOW_TXN_DSN", raising=False)
    monkeypatch.delenv("AIRFLOW_TXN_DSN_FILE", raising=False)
    with pytest.raises(ConfigError, match="set \\$AIRFLOW_TXN_DSN"):
        driver_dsn(None)
    with pytest.raises(ConfigError, match="cannot read the DSN file"):
        driver_dsn(str(tmp_path / "missing"))


def test_sparks_routine_warnings_stay_out_of_the_task_log_but_not_out_of_a_failure(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    op = TransactionalSparkSubmitOperator(task_id="process", topology={"topology_id": "t"}, application="/jobs/w.py",
                                          conn_id="spark_test")
    hook = op._get_hook()
    hook._log = logging.getLogger("test.spark_submit")  # Airflow's own task logger does not reach caplog
    lines = ["13:01:02 WARN NativeCodeLoader: Unable to load native-hadoop library for your platform\n",
             "/venv/lib/python3.11/site-packages/pyspark/sql/connect/utils.py:41: FutureWarning: pandas\n",
             "2026-11-23 13:01:05,120 INFO airflow_transactional.spark_job: result: {\"txid\": 7}\n"]
    with caplog.at_level("INFO"):
        hook._process_spark_submit_log(iter(lines))
    assert "result: {\"txid\": 7}" in caplog.text
    assert "NativeCodeLoader" not in caplog.text and "FutureWarning" not in caplog.text
    assert any("NativeCodeLoader" in line for line in hook._last_submit_log_lines)  # kept for a failure's message


def test_a_dsn_file_goes_where_the_secrets_directory_says(monkeypatch: pytest.MonkeyPatch, cache: Path,
                                                          tmp_path: Path) -> None:
    from airflow_transactional.spark.submit import SECRETS_DIR_ENV, write_dsn_file

    monkeypatch.setenv(SECRETS_DIR_ENV, str(tmp_path / "stack" / "secrets"))
    written = write_dsn_file(DSN)
    assert written.parent == tmp_path / "stack" / "secrets" and written.read_text() == DSN
    assert written.stat().st_mode & 0o777 == 0o600 and written.parent.stat().st_mode & 0o777 == 0o700


def test_a_dsn_file_left_by_a_killed_task_is_removed_once_stale(cache: Path) -> None:
    from airflow_transactional.spark.submit import STALE_DSN_FILE_SECONDS, write_dsn_file

    left = write_dsn_file(DSN)
    os.utime(left, (0, 0))
    fresh = write_dsn_file(DSN)
    assert not left.exists() and fresh.exists()
    assert fresh.stat().st_mtime > 1e9 and STALE_DSN_FILE_SECONDS >= 24 * 3600


def test_an_unwritable_cache_directory_names_the_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow_transactional import files

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("AIRFLOW_TXN_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(ConfigError, match="set AIRFLOW_TXN_CACHE_DIR"):
        files.private_dir(files.cache_dir())


def test_a_skipped_process_task_says_why_as_a_plain_log_line_first(caplog: pytest.LogCaptureFixture,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    op = TransactionalSparkSubmitOperator(task_id="process", topology={"topology_id": "t"}, application="/jobs/w.py")
    # Airflow's own task logger does not reach caplog
    monkeypatch.setattr(TransactionalSparkSubmitOperator, "log", property(lambda _: logging.getLogger("test.process")))
    reason = "txid 7 already committed at 2026-11-23T10:00:00+00:00; nothing to do"
    with caplog.at_level("INFO"), pytest.raises(AirflowSkipException, match="txid 7 already committed"):
        op.skip(reason)
    assert [r.getMessage() for r in caplog.records] == [reason]  # logged before the skip, not only in its group


def test_spark_driver_keeps_the_users_java_options_and_gets_quiet_logs() -> None:
    from airflow_transactional.airflow.dag import LOCAL_SPARK_CONF
    from airflow_transactional.spark.submit import with_quiet_driver_logs

    conf = with_quiet_driver_logs(LOCAL_SPARK_CONF)
    opts = conf["spark.driver.extraJavaOptions"].split()
    assert opts[:2] == ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    assert opts[2].startswith("-Dlog4j2.configurationFile=file:")
    assert with_quiet_driver_logs(conf) == conf  # applied once
    own = {"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=file:/etc/mine.properties"}
    assert with_quiet_driver_logs(own) == own
    # ... and the shared settings object the examples pass is not changed by it
    assert "log4j2" not in LOCAL_SPARK_CONF["spark.driver.extraJavaOptions"]


def test_cli_finds_spark_submit_beside_its_python_when_path_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by the chaos harness: `airflow-txn audit` run as .venv/bin/airflow-txn without
    # .venv/bin on PATH could not start Spark.
    from airflow_transactional.exceptions import TransactionalError
    from airflow_transactional.spark.submit import spark_submit

    monkeypatch.delenv("SPARK_SUBMIT", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert spark_submit() == str(Path(sys.executable).with_name("spark-submit"))
    monkeypatch.setenv("SPARK_SUBMIT", "/opt/spark/bin/spark-submit")
    assert spark_submit() == "/opt/spark/bin/spark-submit"
    monkeypatch.delenv("SPARK_SUBMIT")
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with pytest.raises(TransactionalError, match="put Spark's bin directory on PATH or set SPARK_SUBMIT"):
        spark_submit()


def test_a_local_driver_gets_the_c1_jit_for_a_small_batch_and_the_full_one_for_a_big_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow_transactional.spark.submit import SHORT_JIT, with_jit_for_batch

    def opts(conf: dict[str, str]) -> str:
        return conf.get("spark.driver.extraJavaOptions", "")

    gc = {"spark.driver.extraJavaOptions": "-XX:+UseSerialGC"}
    log_batch = {"log": "tweets", "ranges": [[0, 0, 10]]}
    assert opts(with_jit_for_batch(gc, log_batch, 250_000)) == f"{SHORT_JIT} -XX:+UseSerialGC"
    assert opts(with_jit_for_batch(gc, log_batch, 250_001)) == "-XX:+UseSerialGC"
    small, big = ({"format": "json", "files": [{"path": "/d/a", "size": n}]} for n in (90 << 20, 200 << 20))
    assert opts(with_jit_for_batch({}, small, 1)) == SHORT_JIT and with_jit_for_batch({}, big, 1) == {}
    assert with_jit_for_batch({}, {**small, "format": "parquet"}, 1) == {}  # bytes say little about records
    chosen = {"spark.driver.extraJavaOptions": "-XX:-TieredCompilation"}  # the user's own JIT choice wins
    assert with_jit_for_batch(chosen, small, 1) == chosen
    # Through the operator: only a local master's driver gets it, and the task log says so.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    op = TransactionalSparkSubmitOperator(task_id="process", topology={"topology_id": "t"}, application="/jobs/w.py",
                                          conn_id="spark_test", name="txn-t", conf=dict(gc))
    op.prepare_submit(7, "airflow_txn", DSN, batch=log_batch, planned_records=2_000).remove()
    assert opts(op.conf).startswith(f"{SHORT_JIT} -XX:+UseSerialGC -Dlog4j2.configurationFile=")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", json.dumps({"conn_type": "spark", "host": "spark://h", "port": 7077}))
    cluster_secret(monkeypatch, tmp_path)
    op = TransactionalSparkSubmitOperator(task_id="process", topology={"topology_id": "t"}, application="/jobs/w.py",
                                          conn_id="spark_test", name="txn-t", conf=dict(gc), deploy_mode="client")
    op.prepare_submit(7, "airflow_txn", DSN, batch=log_batch, planned_records=2_000).remove()
    assert SHORT_JIT not in opts(op.conf)


def test_a_standalone_master_without_the_clusters_secret_is_refused_naming_the_fix(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Regression: nothing set ``spark.authenticate``, so any local user fetched a driver's blocks
    and ran applications on the standalone master as its workers' user."""
    standalone = {"host": "spark://h", "port": 7077}
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))  # no spark-defaults.conf there
    with pytest.raises(ConfigError, match=r"needs the cluster's shared secret: put 'spark.authenticate true' and "
                                          r"'spark.authenticate.secret <the cluster's secret>' in the spark-defaults"):
        submit(monkeypatch, standalone, "client")
    cluster_secret(monkeypatch, tmp_path, mode=0o644)
    with pytest.raises(ConfigError, match=r"other users can read it: chmod 600 .*spark-defaults.conf"):
        submit(monkeypatch, standalone, "client")
    # The secret as a setting would be a --conf on the command line.
    for key in ("spark.authenticate.secret", "spark.authenticate.secret.file"):
        with pytest.raises(ConfigError, match=f"{key} in spark_conf would be on spark-submit's command line"):
            submit(monkeypatch, {"host": "local[2]"}, None, conf={key: "hunter2"})
    # An unauthenticated cluster only when asked for by name, and said in the log.
    with caplog.at_level("WARNING"):
        argv, _env, _file = submit(monkeypatch, standalone, "client", conf={"spark.authenticate": "false"})
    assert "spark.authenticate=false" in argv and "spark.network.crypto.enabled=true" not in argv
    assert "any local user can fetch this job's blocks" in caplog.text


def test_every_driver_and_server_the_provider_starts_authenticates() -> None:
    from airflow_transactional.spark.connect_server import spark_connect_server_argv
    from airflow_transactional.spark.submit import spark_submit_argv

    for argv in (spark_submit_argv("local[1]", {}), spark_connect_server_argv(15002)):
        assert " ".join(AUTH) in " ".join(argv)
    # A user's own cipher wins; authentication itself stays on.
    mine = spark_submit_argv("yarn", {"spark.network.crypto.cipher": "AES/CTR/NoPadding", "spark.authenticate": "TRUE"})
    assert "spark.network.crypto.cipher=AES/CTR/NoPadding" in mine and "spark.authenticate=true" in mine


def test_a_driver_given_the_shared_start_up_archive_starts_from_its_spark_home(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The archive maps only for the classpath it was built on: the spark-submit process gets the
    shared Spark home in its environment with it, or it gets neither."""
    from airflow_transactional.spark import cds

    shared = cds.Startup(tmp_path / "spark-homes" / "abc" / "cds-1.jsa", tmp_path / "spark-homes" / "abc")
    monkeypatch.setenv("AIRFLOW_TXN_SPARK_CDS", "on")
    monkeypatch.setattr(cds, "current", lambda directory=None: shared)
    argv, env, _ = submit(monkeypatch, {"host": "local[2]"}, None)
    assert f"-XX:SharedArchiveFile={shared.archive}" in " ".join(argv)
    assert env is not None and env["SPARK_HOME"] == str(shared.spark_home)
    argv, env, _ = submit(monkeypatch, {"host": "yarn"}, "client")
    assert "SharedArchiveFile" not in " ".join(argv) and "SPARK_HOME" not in json.dumps([argv, env])
