"""The class-data-sharing archive is handed to a driver JVM only while it is the one that was
verified: a truncated archive crashes a JVM (SIGBUS), so that must never reach one."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from airflow_transactional.spark import cds as spark_cds

pytestmark = pytest.mark.unit


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake JDK and Spark install, and an empty archive cache."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core.jar").write_bytes(b"x" * 100)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.setenv(spark_cds.DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(spark_cds.SWITCH_ENV, raising=False)
    return tmp_path


def built(archive: Path) -> Path:
    """What build() leaves: the archive, then its sidecar."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(b"CDS" * 1000)
    archive.with_suffix(".json").write_text(json.dumps({"identity": spark_cds._identity(archive)}))
    return archive


def test_a_verified_archive_is_found(machine: Path) -> None:
    archive = spark_cds.archive_path()
    assert archive is not None and archive.parent == machine / "cache"
    assert spark_cds.current() is None  # nothing built yet
    built(archive)
    assert spark_cds.current() == archive


def test_a_truncated_or_replaced_archive_is_not_used(machine: Path) -> None:
    archive = built(spark_cds.archive_path())  # type: ignore[arg-type]
    with open(archive, "r+b") as fh:
        fh.truncate(100)
    assert spark_cds.current() is None
    built(archive)
    replacement = archive.with_name("other.jsa")
    replacement.write_bytes(archive.read_bytes())
    os.replace(replacement, archive)  # same size, another file: not the verified one
    assert spark_cds.current() is None


def test_an_archive_without_a_readable_sidecar_is_not_used(machine: Path) -> None:
    archive = built(spark_cds.archive_path())  # type: ignore[arg-type]
    archive.with_suffix(".json").write_text("{not json")
    assert spark_cds.current() is None
    archive.with_suffix(".json").unlink()
    assert spark_cds.current() is None


def test_another_spark_or_jdk_names_another_archive(machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = spark_cds.archive_path()
    (machine / "spark" / "jars" / "spark-sql.jar").write_bytes(b"y")
    second = spark_cds.archive_path()
    (machine / "jdk" / "bin" / "java").write_text("#!/bin/sh\n# upgraded\n")
    third = spark_cds.archive_path()
    # The same jars installed elsewhere (a second checkout's virtualenv): the JVM's classpath differs.
    shutil.copytree(machine / "spark", machine / "checkout2" / "spark")
    monkeypatch.setenv("SPARK_HOME", str(machine / "checkout2" / "spark"))
    fourth = spark_cds.archive_path()
    # The same virtualenv re-created: same jars, sizes and paths, new modification times (which a
    # JVM checks before it maps the archive).
    jar = machine / "checkout2" / "spark" / "jars" / "spark-core.jar"
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 10**9))
    fifth = spark_cds.archive_path()
    assert len({first, second, third, fourth, fifth}) == 5


def test_the_switch_turns_it_off(machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built(spark_cds.archive_path())  # type: ignore[arg-type]
    monkeypatch.setenv(spark_cds.SWITCH_ENV, "off")
    assert spark_cds.current() is None


def test_no_java_no_archive(machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(machine / "empty"))
    assert spark_cds.archive_path() is None and spark_cds.current() is None
    with pytest.raises(spark_cds.TransactionalError, match="put a JDK 17"):
        spark_cds.build()


def test_the_archive_joins_the_drivers_java_options() -> None:
    archive = Path("/cache/spark-cds-1.jsa")
    conf = {"spark.driver.extraJavaOptions": "-XX:+UseSerialGC", "spark.ui.enabled": "false"}
    assert spark_cds.with_archive(conf, archive) == {
        "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:SharedArchiveFile=/cache/spark-cds-1.jsa",
        "spark.ui.enabled": "false"}
    assert spark_cds.with_archive({}, archive) == {
        "spark.driver.extraJavaOptions": "-XX:SharedArchiveFile=/cache/spark-cds-1.jsa"}
    assert spark_cds.with_archive(conf, None) == conf


def test_a_users_own_sharing_options_win() -> None:
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/mine.jsa"):
        conf = {"spark.driver.extraJavaOptions": own}
        assert spark_cds.with_archive(conf, Path("/cache/a.jsa")) == conf


def test_a_cluster_mode_driver_is_not_given_a_local_archive(machine: Path) -> None:
    from airflow_transactional.airflow.operators import TransactionalSparkSubmitOperator

    built(spark_cds.archive_path())  # type: ignore[arg-type]
    kwargs = {"task_id": "process", "topology": {"topology_id": "t"}, "application": "job.py"}
    assert TransactionalSparkSubmitOperator(**kwargs).startup_archive() == spark_cds.current()
    assert TransactionalSparkSubmitOperator(deploy_mode="cluster", **kwargs).startup_archive() is None


def test_only_archives_no_jvm_can_be_given_are_removed(machine: Path) -> None:
    import fcntl

    java, home = str(machine / "jdk" / "bin" / "java"), machine / "spark"
    other = machine / "checkout2" / "spark"
    shutil.copytree(home, other)
    cache = machine / "cache"

    def archive(name: str, spark_home: Path, jdk: str = java) -> Path:
        path = built(cache / f"spark-cds-{name}.jsa")
        path.with_suffix(".json").write_text(json.dumps({"identity": spark_cds._identity(path), "java": jdk,
                                                         "spark_home": str(spark_home)}))
        return path

    keep = archive("keep", home)
    superseded = archive("old", home)  # this install before its jars or Java changed
    elsewhere = archive("other", other)  # another checkout that still exists
    no_spark = archive("gone", machine / "deleted-venv" / "spark")
    no_java = archive("nojava", other, jdk=str(machine / "old-jdk" / "bin" / "java"))
    building = archive("busy", machine / "deleted-too" / "spark")
    with open(building.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        removed = spark_cds.prune(keep)
    assert sorted(removed) == sorted([superseded, no_spark, no_java])
    for path in removed:
        assert not path.exists() and not path.with_suffix(".json").exists()
    assert keep.exists() and elsewhere.exists() and building.exists()
    assert spark_cds.prune(keep) == [building]  # its lock released
