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


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """build() without a JVM: each archive it would build, written as a real build leaves it."""
    made: list[Path] = []

    def fake_build(path: Path, env: dict[str, str], timeout: float) -> None:
        made.append(path)
        built(path)

    monkeypatch.setattr(spark_cds, "_build_archive", fake_build)
    return made


def built(archive: Path) -> Path:
    """What a build leaves: the archive, then its sidecar."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(b"CDS" * 1000)
    archive.with_suffix(".json").write_text(json.dumps({"identity": spark_cds._identity(archive)}))
    return archive


def fresh_copy(src: Path, dst: Path) -> Path:
    """The same install elsewhere, its files written anew (new modification times), as pip leaves
    a second virtualenv."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    for jar in (dst / "jars").iterdir():
        os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 10**9))
    return dst


def test_a_built_archive_is_found_in_the_shared_home(machine: Path, builds: list[Path]) -> None:
    assert spark_cds.current() is None  # nothing built yet
    startup = spark_cds.build()
    assert startup.spark_home is not None and startup.spark_home.parent == machine / "cache" / "spark-homes"
    assert startup.archive.parent == startup.spark_home and builds == [startup.archive]
    assert spark_cds.current() == startup
    # The shared home holds the install's own bytes (hard links), and the driver is started from it.
    jar = startup.spark_home / "jars" / "spark-core.jar"
    assert jar.read_bytes() == b"x" * 100 and jar.stat().st_ino == (machine / "spark/jars/spark-core.jar").stat().st_ino
    assert startup.env() == {"SPARK_HOME": str(startup.spark_home)}
    assert spark_cds.build() == startup and len(builds) == 1  # found, not built again


def test_every_install_of_the_same_jars_shares_one_archive(machine: Path, builds: list[Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    first = spark_cds.build()
    monkeypatch.setenv("SPARK_HOME", str(fresh_copy(machine / "spark", machine / "checkout2" / "spark")))
    assert spark_cds.current() is None  # this install has not been pointed at one yet
    second = spark_cds.build()
    assert second == first and builds == [first.archive]
    assert len(list((machine / "cache").rglob("*.jsa"))) == 1
    # Other jars: another shared home, another archive.
    (machine / "checkout2" / "spark" / "jars" / "spark-sql.jar").write_bytes(b"y")
    third = spark_cds.build()
    assert third.spark_home != first.spark_home and builds == [first.archive, third.archive]


def test_an_install_with_its_own_conf_keeps_it(machine: Path, builds: list[Path],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (machine / "spark" / "conf").mkdir()
    startup = spark_cds.build()
    assert startup.env() == {"SPARK_HOME": str(startup.spark_home), "SPARK_CONF_DIR": str(machine / "spark" / "conf")}
    monkeypatch.setenv("SPARK_CONF_DIR", "/etc/spark")  # the user's own choice stands
    assert startup.env() == {"SPARK_HOME": str(startup.spark_home)}


def test_where_no_link_can_be_made_the_install_gets_an_archive_of_its_own(
        machine: Path, builds: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def cross_device(src: object, dst: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    startup = spark_cds.build()
    assert startup == spark_cds.Startup(spark_cds.archive_path())  # type: ignore[arg-type]
    assert startup.env() == {} and spark_cds.current() == startup
    assert not any(p.is_dir() for p in (machine / "cache" / "spark-homes").iterdir())  # nothing half-made left


def test_a_truncated_or_replaced_archive_is_not_used(machine: Path, builds: list[Path]) -> None:
    archive = spark_cds.build().archive
    with open(archive, "r+b") as fh:
        fh.truncate(100)
    assert spark_cds.current() is None
    built(archive)
    replacement = archive.with_name("other.jsa")
    replacement.write_bytes(archive.read_bytes())
    os.replace(replacement, archive)  # same size, another file: not the verified one
    assert spark_cds.current() is None


def test_a_shared_jar_touched_since_the_build_is_not_given_to_a_jvm(machine: Path, builds: list[Path]) -> None:
    startup = spark_cds.build()
    jar = machine / "spark" / "jars" / "spark-core.jar"  # the same file as the shared home's
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 5 * 10**9))
    # The install's own pointer changes name with it; an install pointing at the old one is not fooled either.
    assert spark_cds.current() is None
    assert not spark_cds.sharedhome.unchanged(startup.spark_home, spark_cds._read_json(  # type: ignore[arg-type]
        next((machine / "cache").glob("install-*.json")))["jars"])


def test_an_unreadable_pointer_or_sidecar_is_not_used(machine: Path, builds: list[Path]) -> None:
    archive = spark_cds.build().archive
    archive.with_suffix(".json").write_text("{not json")
    assert spark_cds.current() is None
    built(archive)
    pointer = spark_cds.pointer_path()
    assert pointer is not None and spark_cds.current() is not None
    pointer.write_text("[]")
    assert spark_cds.current() is None
    pointer.unlink()
    assert spark_cds.current() is None


def test_another_spark_or_jdk_names_another_pointer(machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = spark_cds.pointer_path()
    (machine / "spark" / "jars" / "spark-sql.jar").write_bytes(b"y")
    second = spark_cds.pointer_path()
    (machine / "jdk" / "bin" / "java").write_text("#!/bin/sh\n# upgraded\n")
    third = spark_cds.pointer_path()
    # The same jars installed elsewhere (a second checkout's virtualenv): the JVM's classpath differs.
    shutil.copytree(machine / "spark", machine / "checkout2" / "spark")
    monkeypatch.setenv("SPARK_HOME", str(machine / "checkout2" / "spark"))
    fourth = spark_cds.pointer_path()
    # The same virtualenv re-created: same jars, sizes and paths, new modification times (which a
    # JVM checks before it maps the archive).
    jar = machine / "checkout2" / "spark" / "jars" / "spark-core.jar"
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 10**9))
    fifth = spark_cds.pointer_path()
    assert len({first, second, third, fourth, fifth}) == 5


def test_the_switch_turns_it_off(machine: Path, builds: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    spark_cds.build()
    monkeypatch.setenv(spark_cds.SWITCH_ENV, "off")
    assert spark_cds.current() is None


def test_no_java_no_archive(machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(machine / "empty"))
    assert spark_cds.archive_path() is None and spark_cds.current() is None
    with pytest.raises(spark_cds.TransactionalError, match="put a JDK 17"):
        spark_cds.build()


def test_the_archive_joins_the_drivers_java_options() -> None:
    startup = spark_cds.Startup(Path("/cache/spark-cds-1.jsa"))
    conf = {"spark.driver.extraJavaOptions": "-XX:+UseSerialGC", "spark.ui.enabled": "false"}
    assert spark_cds.with_archive(conf, startup) == {
        "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:SharedArchiveFile=/cache/spark-cds-1.jsa",
        "spark.ui.enabled": "false"}
    assert spark_cds.with_archive({}, startup) == {
        "spark.driver.extraJavaOptions": "-XX:SharedArchiveFile=/cache/spark-cds-1.jsa"}
    assert spark_cds.with_archive(conf, None) == conf and spark_cds.env_of(None) == {}


def test_a_users_own_sharing_options_win() -> None:
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/mine.jsa"):
        conf = {"spark.driver.extraJavaOptions": own}
        assert spark_cds.with_archive(conf, spark_cds.Startup(Path("/cache/a.jsa"))) == conf


def test_a_driver_the_task_cannot_start_from_the_shared_home_is_not_given_its_archive(
        machine: Path, builds: list[Path]) -> None:
    from airflow_transactional.airflow.operators import TransactionalSparkSubmitOperator

    startup = spark_cds.build()
    kwargs = {"task_id": "process", "topology": {"topology_id": "t"}, "application": "job.py"}
    for master in ("local[2]", "spark://m:7077"):
        assert TransactionalSparkSubmitOperator(**kwargs).startup_archive(master) == startup
    # In cluster mode the driver runs elsewhere; on YARN or Kubernetes Airflow's hook sends the
    # environment to the cluster, not to the local spark-submit that starts the driver.
    assert TransactionalSparkSubmitOperator(deploy_mode="cluster", **kwargs).startup_archive("local[2]") is None
    for master in ("yarn", "k8s://https://api:6443"):
        assert TransactionalSparkSubmitOperator(**kwargs).startup_archive(master) is None


def test_only_what_no_install_can_use_is_removed(machine: Path, builds: list[Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    cache = machine / "cache"
    here = spark_cds.build()
    elsewhere = fresh_copy(machine / "spark", machine / "checkout2" / "spark")
    (elsewhere / "jars" / "spark-sql.jar").write_bytes(b"y")  # other jars: another shared home
    monkeypatch.setenv("SPARK_HOME", str(elsewhere))
    other = spark_cds.build()
    busy = built(other.spark_home / "cds-busy.jsa")  # type: ignore[operator]
    legacy = built(cache / "spark-cds-0123456789abcdef.jsa")  # an archive of the layout before shared homes
    monkeypatch.setenv("SPARK_HOME", str(machine / "spark"))
    with open(busy.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # being built by another process
        removed = spark_cds.prune(here)
    assert removed == [legacy] and not legacy.exists() and not legacy.with_suffix(".json").exists()
    assert spark_cds.current() == here and busy.exists()
    # The install's jars change: its old pointer is superseded, the old shared home no longer named.
    (machine / "spark" / "jars" / "spark-core.jar").write_bytes(b"z" * 100)
    newer = spark_cds.build()
    assert not here.spark_home.exists() and not here.archive.exists()  # type: ignore[union-attr]
    assert newer.spark_home != here.spark_home and len(list(cache.glob("install-*.json"))) == 2
    # The second checkout deleted: its pointer, its shared home (which kept its jars alive) go too.
    other_pointer = next(p for p in cache.glob("install-*.json") if "checkout2" in p.read_text())
    shutil.rmtree(machine / "checkout2")
    removed = spark_cds.prune(newer)
    assert {other_pointer, other.spark_home} <= set(removed) and not other.spark_home.exists()  # type: ignore[union-attr]
    assert [p.name for p in (cache / "spark-homes").iterdir() if p.is_dir()] == [newer.spark_home.name]  # type: ignore[union-attr]
    assert spark_cds.current() == newer
