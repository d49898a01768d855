"""The pure parts of landing on S3 and HDFS: which URLs name a landing directory, what of a
connection reaches Spark's s3a reader (an allow-list, secrets included only as options), how an
Airflow connection of each type is read, and how a file's name is written for Spark's reader."""

from __future__ import annotations

import pytest

from airflow_transactional.connections import settings_of
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.sources import LandingDirectory, ObjectLanding
from airflow_transactional.sources.objects import split_url
from airflow_transactional.sources.s3 import s3a_options
from airflow_transactional.spark.pinned import glob_escaped

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("url", ["s3a://bucket/in", "s3a://bucket", "s3a://bucket/a/b/", "hdfs://nn:8020/landing"])
def test_a_store_url_declares_a_landing_directory_on_it(url: str) -> None:
    source = LandingDirectory(url)
    assert isinstance(source, ObjectLanding) and source.path == url.rstrip("/")
    assert source.conn_id == ("aws_default" if url.startswith("s3a") else None)


@pytest.mark.parametrize(("url", "says"), [
    ("s3://bucket/in", "s3a://bucket/prefix"),  # Hadoop's s3a, not the old s3 scheme
    ("gs://bucket/in", "s3a://bucket/prefix"),
    ("s3a://key:secret@bucket/in", "credentials come from the connection"),
    ("s3a://bucket/in?x=1", "no user, query or fragment"),
    ("s3a://bucket/a/../b", "without empty, '.' or '..' parts"),
    ("s3a://bucket/a//b", "without empty"),
    ("hdfs://nn:8020", "name a directory"),
    ("s3a://bucket/in dir", "without spaces"),
])
def test_a_bad_store_url_is_refused_naming_the_fix(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(".", r"\.")):
        split_url(url)


def test_store_options_are_refused_on_a_local_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=r"conn_id.*S3 or HDFS"):
        LandingDirectory(str(tmp_path), conn_id="aws_default")
    with pytest.raises(ConfigError, match="listing must be one of full, incremental"):
        LandingDirectory("s3a://bucket/in", listing="sometimes")


def test_an_aws_connection_maps_to_s3a_through_an_allow_list() -> None:
    settings = settings_of("aws", login="AKIAEXAMPLE", password="s3cret", extra={
        "endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1",
        "config_kwargs": {"s3": {"addressing_style": "path"}},
        "s3a": {"fs.s3a.encryption.algorithm": "SSE-KMS", "fs.s3a.encryption.key": "arn:aws:kms:k"}})
    opts = s3a_options(settings, "aws_default")
    assert opts == {
        "fs.s3a.access.key": "AKIAEXAMPLE", "fs.s3a.secret.key": "s3cret", "fs.s3a.endpoint": "http://127.0.0.1:9000",
        "fs.s3a.connection.ssl.enabled": "false", "fs.s3a.endpoint.region": "eu-west-1",
        "fs.s3a.path.style.access": "true", "fs.s3a.change.detection.mode": "server",
        "fs.s3a.change.detection.source": "etag", "fs.s3a.encryption.algorithm": "SSE-KMS",
        "fs.s3a.encryption.key": "arn:aws:kms:k"}
    # No credentials: the machine's own (a role); nothing of them is set.
    assert not {"fs.s3a.access.key", "fs.s3a.secret.key"} & set(s3a_options(settings_of("aws", extra={})))
    with pytest.raises(ConfigError, match=r"s3a settings \['fs.s3a.impl'\] are not among"):
        s3a_options({"s3a": {"fs.s3a.impl": "org.example.Evil"}}, "aws_default")
    with pytest.raises(ConfigError, match=r"\['fs.defaultFS'\]"):
        ObjectLanding("s3a://bucket/in", connections=_known({"s3a": {"fs.defaultFS": "hdfs://x"}})).store  # noqa: B018


def _known(settings: dict[str, object]):  # type: ignore[no-untyped-def]
    from airflow_transactional.connections import Connections

    return Connections(known={"aws_default": settings})


def test_each_connection_type_gives_what_its_source_reads() -> None:
    assert settings_of("kafka", login="x", extra={"bootstrap.servers": "b:9092"}) == {"bootstrap.servers": "b:9092"}
    assert settings_of("webhdfs", host="nn", port=9870, login="etl", extra={"use_ssl": True}) == {
        "host": "nn", "port": 9870, "login": "etl", "use_ssl": True}
    assert settings_of("aws", extra={"region_name": "us-east-1"}) == {"region_name": "us-east-1"}


def test_a_landing_directory_on_a_store_says_no_secret_in_its_declaration() -> None:
    source = ObjectLanding("s3a://bucket/in", connections=_known({"aws_access_key_id": "AKIA", "aws_secret_access_key":
                                                                  "s3cret"}))
    assert "s3cret" not in repr(source) and "s3cret" not in str(source.to_config())
    assert "s3cret" not in repr(source.store)


@pytest.mark.parametrize(("name", "escaped"), [
    ("a.json", "a.json"), ("f[1].json", "f\\[1\\].json"), ("x{a,b}*?.json", "x\\{a,b\\}\\*\\?.json"),
    ("b\\s.json", "b\\\\s.json")])
def test_a_name_is_escaped_for_spark_s_reader_to_take_it_literally(name: str, escaped: str) -> None:
    assert glob_escaped(name) == escaped


class BytesStore:
    """A store of one file held in memory: what parquet_problem reads of it, and how much."""

    def __init__(self, data: bytes) -> None:
        self.data, self.read = data, 0

    def piece(self, planned: object, offset: int, length: int) -> bytes:
        self.read += length
        return self.data[offset:offset + length]


def test_a_parquet_footer_is_checked_from_three_ranged_reads() -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_transactional.sources.objects import StoredFile, parquet_problem

    buf = io.BytesIO()
    pq.write_table(pa.table({"url": [f"https://a.org/{i}" for i in range(20_000)], "user": ["u"] * 20_000}), buf)
    good = buf.getvalue()

    def problem(data: bytes) -> str | None:
        store = BytesStore(data)
        why = parquet_problem(store, StoredFile("s3a://b/in/f.parquet", len(data), "e", 0))  # type: ignore[arg-type]
        assert store.read < 4096 + 16, store.read  # the footer, never the whole file
        return why

    assert problem(good) is None and len(good) > 50_000
    assert "no footer at its end" in (problem(good[:-100]) or "")  # cut short: a partial upload
    assert "does not begin with PAR1" in (problem(b"x" + good[1:]) or "")
    assert "too short" in (problem(b"PAR1") or "")
    mangled = good[:-300] + b"\xff" * 100 + good[-200:]  # the footer's bytes overwritten: it does not parse
    assert (problem(mangled) or "").startswith("unreadable Parquet file: ")
