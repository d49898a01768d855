"""Landing directories on a real S3 server (S3Proxy) and a real HDFS (NameNode + DataNode): files
batched in the order the planner first sees them, each planned version read exactly or not at all
-- an overwrite, a delete, a re-upload or an append between plan and process is a clear failure
of a transactional topology, and a new version planned later; an opaque one re-plans without it
and records the loss."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import BatchUnavailable, ConfigError, SourceUnreachable
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import LandingDirectory
from airflow_transactional.sources.objectlanding import ObjectLanding
from airflow_transactional.spec import StateSpec, TopologySpec
from dev.hdfs import HdfsCluster
from dev.s3 import S3Server
from tests import object_stores
from tests.helpers import query, table

pytestmark = pytest.mark.integration


class Place(object_stores.Place):
    """A landing directory on one of the stores, its files of ``{"user": ...}`` records."""

    def put(self, name: str, users: list[str]) -> None:
        self.put_lines(name, [json.dumps({"user": u}) for u in users])

    def source(self, **kwargs: Any) -> LandingDirectory:
        return LandingDirectory(self.url, settle_seconds=0, conn_id=self.conn_id, **kwargs)


@pytest.fixture(params=["s3", "hdfs"])
def place(request: pytest.FixtureRequest) -> Iterator[Place]:
    server: S3Server | HdfsCluster = request.getfixturevalue(request.param)
    yield Place(request.param, server)


def _topology(place: Place, *, opaque: bool = False, max_files: int = 2) -> TopologySpec:
    return TopologySpec("files", place.source(max_files=max_files),
                        [StateSpec("file_counts", {"user_id": "text"}, combiner="count",
                                   kind="opaque" if opaque else "transactional")], opaque=opaque)


def _fn(r):  # type: ignore[no-untyped-def]
    return [("file_counts", (r["user"],), 1)]


def _names(txn: Any) -> list[str]:
    return [f["path"].rsplit("/", 1)[1] for f in txn.batch["files"]]


def _run(coordinator: Coordinator, txid: int) -> None:
    process_batch(coordinator, "files", txid, _fn)
    coordinator.commit("files", txid)


def test_a_url_declares_a_landing_directory_on_its_store(place: Place) -> None:
    source = place.source(format="json")
    assert isinstance(source, ObjectLanding)
    assert source.to_config()["path"] == place.url
    assert LandingDirectory(**{k: v for k, v in source.to_config().items() if k != "kind"}) == source


def test_files_are_planned_in_arrival_order_with_their_versions_and_counted_once(
        coordinator: Coordinator, place: Place, dsn: str) -> None:
    coordinator.register(_topology(place))
    for name, users in (("b.json", ["x"]), ("a.json", ["x", "y"]), ("c.json", ["y"])):
        place.put(name, users)
        time.sleep(1.1)  # S3 says when an object was written to the second: let the order be plain
    place.put("_partial.json", ["ignored"])
    waiting = coordinator.status("files")  # files and bytes waiting, as the store lists them
    assert (waiting.lag, waiting.lag_bytes) == (3, sum(len(json.dumps({"user": u}).encode()) + 1
                                                       for u in ["x", "x", "y", "y"]))
    t1 = coordinator.plan("files", "r1")
    assert _names(t1) == ["b.json", "a.json"]
    assert all(f["version"] and f["size"] > 0 for f in t1.batch["files"])
    t2 = coordinator.plan("files", "r2")
    assert _names(t2) == ["c.json"]
    for t in (t1, t2):
        _run(coordinator, t.txid)
    assert table(dsn, "file_counts") == {"x": 2, "y": 2}
    assert coordinator.status("files").lag == 0


def test_a_file_overwritten_after_its_plan_fails_the_attempt_and_is_a_new_version(
        coordinator: Coordinator, place: Place, dsn: str) -> None:
    coordinator.register(_topology(place))
    place.put("a.json", ["x"])
    t1 = coordinator.plan("files", "r1")
    place.put("a.json", ["y", "y"])  # a new upload under the planned name
    with pytest.raises(BatchUnavailable, match=r"a\.json.*declare the topology opaque=True"):
        process_batch(coordinator, "files", t1.txid, _fn)
    # The planned version is gone for good: nothing of the new one is counted as txid 1.
    assert table(dsn, "file_counts") == {}


def test_an_opaque_topology_replans_without_a_deleted_file_and_records_the_loss(
        coordinator: Coordinator, place: Place, dsn: str) -> None:
    coordinator.register(_topology(place, opaque=True, max_files=1))
    place.put("a.json", ["a"])
    time.sleep(1.1)
    place.put("b.json", ["b"])
    t1, t2 = coordinator.plan("files", "r1"), coordinator.plan("files", "r2")
    place.delete("a.json")
    for t in (t1, t2):
        _run(coordinator, t.txid)
    assert table(dsn, "file_counts") == {"b": 1}
    assert coordinator.status("files").lost_records == 1
    # The name landed again: a new version, counted -- and what an audit or a rebuild recomputes
    # skips only the version lost, not every version of its name.
    place.put("a.json", ["c"])
    time.sleep(1.1)
    t3 = coordinator.plan("files", "r3")
    assert _names(t3) == ["a.json"]
    _run(coordinator, t3.txid)
    assert table(dsn, "file_counts") == {"b": 1, "c": 1}
    batch, why_not = coordinator.committed_batch("files")
    assert why_not is None and sorted(f["path"].rsplit("/", 1)[1] for f in batch.files) == ["a.json", "b.json"]
    assert [f["version"] for f in batch.files if f["path"].endswith("a.json")] == [t3.batch["files"][0]["version"]]


def test_a_replaced_file_is_planned_again_later_as_a_new_version(
        coordinator: Coordinator, place: Place, dsn: str) -> None:
    coordinator.register(_topology(place, opaque=True))
    place.put("a.json", ["x"])
    t1 = coordinator.plan("files", "r1")
    _run(coordinator, t1.txid)
    place.delete("a.json")
    place.put("a.json", ["y", "z"])  # re-uploaded: other bytes under the same name
    t2 = coordinator.plan("files", "r2")
    assert _names(t2) == ["a.json"] and t2.batch["files"][0]["version"] != t1.batch["files"][0]["version"]
    _run(coordinator, t2.txid)
    assert table(dsn, "file_counts") == {"x": 1, "y": 1, "z": 1}


def test_max_batch_bytes_caps_a_batch_and_a_larger_file_is_a_batch_of_its_own(
        coordinator: Coordinator, place: Place, dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    coordinator.register(TopologySpec("files", place.source(max_files=10, max_batch_bytes=2000),
                                      [StateSpec("file_counts", {"user_id": "text"}, combiner="count")]))
    for name, n in (("a.json", 40), ("b.json", 40), ("c.json", 200), ("d.json", 40)):  # 14 bytes a line
        place.put(name, [name[0]] * n)
        time.sleep(1.1)  # S3 keeps a second of the upload's time: arrival order by name
    with caplog.at_level("WARNING", logger="airflow_transactional.sources.landing"):
        t1, t2, t3 = (coordinator.plan("files", f"r{k}") for k in range(3))
    assert [_names(t) for t in (t1, t2, t3)] == [["a.json", "b.json"], ["c.json"], ["d.json"]]
    assert "c.json is 2,800 bytes, more than max_batch_bytes (2,000): it is planned in a batch of its own" \
        in caplog.text
    for t in (t1, t2, t3):
        _run(coordinator, t.txid)
    assert table(dsn, "file_counts") == {"a": 40, "b": 40, "c": 200, "d": 40}


def test_the_same_bytes_uploaded_again_are_the_same_file(coordinator: Coordinator, s3: S3Server) -> None:
    place = Place("s3", s3)
    coordinator.register(_topology(place))
    place.put("a.json", ["x"])
    t1 = coordinator.plan("files", "r1")
    time.sleep(1.1)
    place.put("a.json", ["x"])  # touched: a new last-modified, the same ETag
    _run(coordinator, t1.txid)
    assert coordinator.status("files").lag == 0
    assert coordinator.plan("files", "r2").batch["files"] == []


def test_a_file_appended_after_its_plan_is_a_new_version(coordinator: Coordinator, hdfs: HdfsCluster,
                                                         dsn: str) -> None:
    place = Place("hdfs", hdfs)
    coordinator.register(_topology(place, opaque=True))
    place.put("a.json", ["x"])
    t1 = coordinator.plan("files", "r1")
    hdfs.append(f"{place.dir}/a.json", b'{"user": "y"}\n')
    _run(coordinator, t1.txid)  # opaque: re-planned without the planned version, which is gone
    assert table(dsn, "file_counts") == {}
    assert coordinator.status("files").lost_records == 1
    t2 = coordinator.plan("files", "r2")  # the file as it is now: a new version, in a later txid
    assert _names(t2) == ["a.json"] and t2.batch["files"][0]["size"] > t1.batch["files"][0]["size"]
    _run(coordinator, t2.txid)
    assert table(dsn, "file_counts") == {"x": 1, "y": 1}


def test_an_upload_in_progress_is_not_planned_until_it_completes(coordinator: Coordinator, s3: S3Server,
                                                                   dsn: str) -> None:
    place = Place("s3", s3)
    coordinator.register(_topology(place))
    client = s3.client()
    upload = client.create_multipart_upload(Bucket=place.bucket, Key="in/big.json")["UploadId"]
    part = client.upload_part(Bucket=place.bucket, Key="in/big.json", UploadId=upload, PartNumber=1,
                              Body=b'{"user": "m"}\n' * 10)
    t1 = coordinator.plan("files", "r1")
    assert t1.batch["files"] == []
    _run(coordinator, t1.txid)
    client.complete_multipart_upload(Bucket=place.bucket, Key="in/big.json", UploadId=upload,
                                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    t2 = coordinator.plan("files", "r2")
    assert _names(t2) == ["big.json"]
    _run(coordinator, t2.txid)
    assert table(dsn, "file_counts") == {"m": 10}


def test_odd_names_and_an_empty_object_are_read_as_they_are(coordinator: Coordinator, place: Place,
                                                            dsn: str) -> None:
    coordinator.register(_topology(place, max_files=10))
    place.put("with space+plus%25 é.json", ["odd"])
    place.put_bytes("empty.json", b"")
    t1 = coordinator.plan("files", "r1")
    assert sorted(_names(t1)) == ["empty.json", "with space+plus%25 é.json"]
    _run(coordinator, t1.txid)
    assert table(dsn, "file_counts") == {"odd": 1}


def test_a_store_out_of_reach_is_said_and_a_retry_after_it_returns_plans(
        coordinator: Coordinator, s3: S3Server, dsn: str) -> None:
    place = Place("s3", s3)
    coordinator.register(_topology(place))
    place.put("a.json", ["x"])
    s3.kill()
    try:
        with pytest.raises(SourceUnreachable, match=r"did not answer.*endpoint_url"):
            coordinator.plan("files", "r1")
    finally:
        s3.restart()
    _run(coordinator, coordinator.plan("files", "r1").txid)
    assert table(dsn, "file_counts") == {"x": 1}


def test_wrong_credentials_and_a_missing_bucket_name_the_fix(coordinator: Coordinator, s3: S3Server,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator.register(TopologySpec("nobucket", LandingDirectory("s3a://no-such-bucket/in", settle_seconds=0),
                                      [StateSpec("c", {"user_id": "text"}, combiner="count")]))
    with pytest.raises(ConfigError, match="bucket does not exist -- create it, or fix the landing URL"):
        coordinator.plan("nobucket", "r1")
    place = Place("s3", s3)
    coordinator.register(_topology(place))
    wrong = {**s3.connection(), "password": "not-the-secret"}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(wrong))
    fresh = Coordinator(coordinator.dsn)
    try:
        with pytest.raises(ConfigError, match=r"refused .*check the connection's access key and secret"):
            fresh.plan("files", "r1")
    finally:
        fresh.close()


def test_the_expected_bucket_owner_is_said_on_every_request_and_named_in_a_refusal(
        coordinator: Coordinator, s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    # S3 refuses (403) a request whose x-amz-expected-bucket-owner is not the bucket's account.
    # S3Proxy does not check it: shown here is that every request the planner and the reader make
    # says it, and that a refusal names it as a cause and the fix.
    place = Place("s3", s3)
    place.put("a.json", ["a"])
    owned = {**s3.connection(), "extra": {**s3.connection()["extra"], "expected_bucket_owner": "111122223333"}}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(owned))
    source = ObjectLanding(place.url, conn_id="aws_default", settle_seconds=0)
    sent: list[tuple[str, str | None]] = []
    source.store.client.meta.events.register(  # type: ignore[attr-defined]
        "before-send.s3", lambda request, **_: sent.append((request.method, request.headers.get(
            "x-amz-expected-bucket-owner"))))
    (f,) = list(source.store.listing())
    assert source.store.stat(f.path) == f and b"".join(source.store.blocks(f)) == b'{"user": "a"}\n'
    # The bucket's versioning (asked once), the listing, the look-up, the read.
    assert [m for m, _ in sent] == ["GET", "GET", "HEAD", "GET"] and {o for _, o in sent} == {b"111122223333"}
    for bad in ("1111-2222-3333", 111122223333, "arn:aws:iam::111122223333:root"):
        monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(
            {**owned, "extra": {**owned["extra"], "expected_bucket_owner": bad}}))
        with pytest.raises(ConfigError, match="expected_bucket_owner must be the 12-digit AWS account id"):
            _ = ObjectLanding(place.url, conn_id="aws_default").store
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({**owned, "password": "not-the-secret"}))
    with pytest.raises(ConfigError, match=r"refused .* and that account 111122223333 owns the bucket \(the "
                                          r"connection's expected_bucket_owner"):
        list(ObjectLanding(place.url, conn_id="aws_default").store.listing())


def test_an_incremental_listing_finds_new_names_after_the_last_and_the_rest_at_its_full_listing(
        coordinator: Coordinator, place: Place, dsn: str) -> None:
    coordinator.register(TopologySpec("files", place.source(max_files=10, listing="incremental",
                                                            full_listing_seconds=3600),
                                      [StateSpec("file_counts", {"user_id": "text"}, combiner="count")]))
    place.put("2026-01-01.json", ["a"])
    t1 = coordinator.plan("files", "r1")  # the first plan lists everything
    _run(coordinator, t1.txid)
    place.put("2026-01-02.json", ["b"])
    place.put("2025-12-31.json", ["late"])  # sorts before the last name registered
    t2 = coordinator.plan("files", "r2")
    assert _names(t2) == ["2026-01-02.json"]
    _run(coordinator, t2.txid)
    assert coordinator.status("files").lag == 0  # the status lists as the plans do
    query(dsn, "UPDATE airflow_txn.landing_listings SET full_at = now() - interval '2 hours'")
    t3 = coordinator.plan("files", "r3")  # the full listing, due: the straggler is planned
    assert _names(t3) == ["2025-12-31.json"]
    _run(coordinator, t3.txid)
    assert table(dsn, "file_counts") == {"a": 1, "b": 1, "late": 1}
