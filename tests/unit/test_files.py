"""Private files: the ``--py-files`` zip and the log4j config cannot be planted by another user."""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

import pytest

from airflow_transactional import files
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.spark import submit as spark_job

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(files.DIR_ENV, str(tmp_path / "cache"))
    yield tmp_path / "cache"


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_provider_zip_lives_in_a_private_directory_and_holds_the_package(cache: Path) -> None:
    path = Path(spark_job.provider_zip())
    assert path.parent == cache / "artifacts"
    assert mode(path.parent) == 0o700 and mode(path) == 0o600
    assert os.stat(path).st_uid == os.geteuid()
    with zipfile.ZipFile(path) as zf:
        assert "airflow_transactional/spark_job.py" in zf.namelist()
    assert str(Path(spark_job.quiet_log_config()).parent) == str(path.parent)


def test_a_planted_file_at_the_artifact_name_is_replaced_not_used(cache: Path) -> None:
    genuine = Path(spark_job.provider_zip()).read_bytes()
    target = Path(spark_job.provider_zip())
    target.write_bytes(b"PK planted code")  # same name, other content
    # Regression: within one process the cached path was handed out again without a look.
    assert Path(spark_job.provider_zip()).read_bytes() == genuine


def test_an_artifact_others_can_write_is_rewritten_private(cache: Path) -> None:
    target = files.artifact("x", ".txt", b"hello")
    os.chmod(target, 0o666)
    again = files.artifact("x", ".txt", b"hello")
    assert again == target and mode(again) == 0o600 and again.read_bytes() == b"hello"


def test_the_same_sources_give_the_same_zip(cache: Path) -> None:
    first = Path(spark_job.provider_zip())
    from airflow_transactional.spark import submit

    submit._provider_zip_bytes.cache_clear()
    assert Path(spark_job.provider_zip()) == first  # deterministic: no timestamps in the name's digest


def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can make a directory owned by another user")
    d = tmp_path / "theirs"
    d.mkdir()
    os.chown(d, 65534, 65534)
    with pytest.raises(ConfigError, match="belongs to another user"):
        files.private_dir(d)


def test_a_loose_private_directory_is_tightened(tmp_path: Path) -> None:
    d = tmp_path / "mine"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    assert mode(files.private_dir(d)) == 0o700


def test_private_files_are_never_readable_by_others_even_with_a_loose_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        written = files.write_private(tmp_path / "secret.json", "{}")
        fd = files.open_private_log(tmp_path / "component.log")
        os.close(fd)
    finally:
        os.umask(old)
    assert mode(written) == 0o600 and mode(tmp_path / "component.log") == 0o600
    assert not list(tmp_path.glob(".secret.json.*"))  # the temporary file was renamed, not left


def test_a_cache_reached_through_a_parent_others_may_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      cache: Path) -> None:
    """Regression: only the last component was checked; under a shared XDG_CACHE_HOME another user
    swapped the verified directory for theirs."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # world-writable, no sticky bit: anyone may rename what is in it
    monkeypatch.setenv(files.DIR_ENV, str(shared / "cache"))
    with pytest.raises(ConfigError, match=f"reached through {shared}, which others may write in it"):
        spark_job.provider_zip()
    os.chmod(shared, 0o1777)  # sticky, as /tmp: nobody else may rename our directory
    assert Path(spark_job.provider_zip()).parent == shared / "cache" / "artifacts"


def test_a_cache_reached_through_another_users_link_or_directory_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    link = tmp_path / "link"
    link.symlink_to(mine)
    monkeypatch.setenv(files.DIR_ENV, str(link / "cache"))
    assert Path(spark_job.provider_zip()).parent == link / "cache" / "artifacts"  # our own link: followed
    if os.geteuid() == 0:  # only root can give a link or a directory to another user
        os.lchown(link, 65534, 65534)
        with pytest.raises(ConfigError, match=f"reached through {link}, which belongs to another user"):
            spark_job.provider_zip()
        os.lchown(link, 0, 0)
        os.chown(mine, 65534, 65534)
        with pytest.raises(ConfigError, match="belongs to another user"):
            spark_job.provider_zip()
