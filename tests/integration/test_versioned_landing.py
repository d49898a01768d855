"""A landing directory in an S3 bucket that keeps versions (S3Mock, versioning enabled): every
version a key ever held is a file of its own, counted once -- those overwritten before any plan
ran too -- and a planned version is read by its id whatever the key holds by then; a version
deleted from the bucket's history is a clear failure (transactional) or a recorded loss (opaque).
On a bucket without versions (S3Proxy) the same uploads count what the bucket still holds."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import BatchUnavailable
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import LandingDirectory
from airflow_transactional.spec import StateSpec, TopologySpec
from dev.s3 import S3Server
from dev.s3versioned import VersionedS3Server
from tests.helpers import table
from tests.object_stores import Place

pytestmark = pytest.mark.integration


def _topology(place: Place, *, opaque: bool = False, max_files: int = 10) -> TopologySpec:
    return TopologySpec("files", LandingDirectory(place.url, settle_seconds=0, max_files=max_files),
                        [StateSpec("file_counts", {"user_id": "text"}, combiner="count",
                                   kind="opaque" if opaque else "transactional")], opaque=opaque)


def _fn(r):  # type: ignore[no-untyped-def]
    return [("file_counts", (r["user"],), 1)]


def _put(place: Place, name: str, users: list[str]) -> None:
    place.put_lines(name, [json.dumps({"user": u}) for u in users])
    time.sleep(0.05)  # each version its own millisecond: upload order is plain


def _run(coordinator: Coordinator, txid: int) -> None:
    process_batch(coordinator, "files", txid, _fn)
    coordinator.commit("files", txid)


def _versions(txn: Any) -> list[tuple[str, str]]:
    return [(f["path"].rsplit("/", 1)[1], f["version"]) for f in txn.batch["files"]]


def _uploads(place: Place) -> list[tuple[str, str]]:
    """(name, version) of every upload under the prefix, oldest first, as the bucket lists them."""
    found = place.server.client().list_object_versions(Bucket=place.bucket, Prefix="in/")["Versions"]
    return [(v["Key"].rsplit("/", 1)[1], f'{v["ETag"]}?versionId={v["VersionId"]}')
            for v in sorted(found, key=lambda v: v["LastModified"])]


def test_every_version_is_counted_once_even_those_overwritten_before_any_plan(
        coordinator: Coordinator, s3v: VersionedS3Server, dsn: str) -> None:
    place = Place("s3", s3v)
    coordinator.register(_topology(place))
    for users in (["x"], ["y", "y"], ["z"]):  # three uploads under one key before the first plan
        _put(place, "a.json", users)
    _put(place, "b.json", ["w"])
    _put(place, "b.json", ["w"])  # the same bytes again: S3 keeps it as a version of its own
    assert coordinator.status("files").lag == 5
    t1 = coordinator.plan("files", "r1")
    assert _versions(t1) == _uploads(place)  # each version, in upload order, pinned by its id
    _run(coordinator, t1.txid)
    assert table(dsn, "file_counts") == {"x": 1, "y": 2, "z": 1, "w": 2}
    assert coordinator.status("files").lag == 0
    assert coordinator.plan("files", "r2").batch["files"] == []  # nothing counted twice
    # What an audit or a rebuild recomputes is every committed version, each read by its id.
    batch, why_not = coordinator.committed_batch("files")
    assert why_not is None and [(f["path"].rsplit("/", 1)[1], f["version"]) for f in batch.files] == _uploads(place)


def test_a_planned_version_overwritten_before_its_attempt_is_read_by_its_id(
        coordinator: Coordinator, s3v: VersionedS3Server, dsn: str) -> None:
    place = Place("s3", s3v)
    coordinator.register(_topology(place))
    _put(place, "a.json", ["x"])
    t1 = coordinator.plan("files", "r1")
    _put(place, "a.json", ["y", "y"])  # on a bucket without versions this fails txid 1's attempt
    _run(coordinator, t1.txid)
    assert table(dsn, "file_counts") == {"x": 1}
    t2 = coordinator.plan("files", "r2")
    assert [name for name, _ in _versions(t2)] == ["a.json"] and _versions(t2) != _versions(t1)
    _run(coordinator, t2.txid)
    assert table(dsn, "file_counts") == {"x": 1, "y": 2}


@pytest.mark.parametrize("opaque", [False, True])
def test_a_version_deleted_from_the_history_fails_its_txid_or_is_a_recorded_loss(
        coordinator: Coordinator, s3v: VersionedS3Server, dsn: str, opaque: bool) -> None:
    place = Place("s3", s3v)
    coordinator.register(_topology(place, opaque=opaque, max_files=1))
    _put(place, "a.json", ["x"])
    _put(place, "a.json", ["y"])
    t1, t2 = coordinator.plan("files", "r1"), coordinator.plan("files", "r2")
    version_id = _versions(t1)[0][1].split("?versionId=")[1]
    place.server.client().delete_object(Bucket=place.bucket, Key="in/a.json", VersionId=version_id)
    if not opaque:
        with pytest.raises(BatchUnavailable, match=r"a\.json\)\. The source is transactional: a version deleted from "
                                                   "the bucket's history cannot be restored, or declare the topology "
                                                   "opaque=True"):
            process_batch(coordinator, "files", t1.txid, _fn)
        assert table(dsn, "file_counts") == {}
        return
    for t in (t1, t2):
        _run(coordinator, t.txid)
    assert table(dsn, "file_counts") == {"y": 1}
    assert coordinator.status("files").lost_records == 1


def test_on_a_bucket_without_versions_an_overwrite_before_any_plan_read_it_is_reported(
        coordinator: Coordinator, s3: S3Server, dsn: str) -> None:
    # The control: S3Proxy keeps no versions. b.json's first content, registered by txid 1's listing
    # but left for later (max_files=1), is overwritten before a plan read it: gone, and reported.
    # What no listing saw (two uploads between two plans) no one can know.
    place = Place("s3", s3)
    coordinator.register(_topology(place, max_files=1))
    _put(place, "a.json", ["x"])
    time.sleep(1.1)
    _put(place, "b.json", ["y"])
    t1 = coordinator.plan("files", "r1")
    time.sleep(1.1)
    _put(place, "b.json", ["z", "z"])
    t2 = coordinator.plan("files", "r2")
    assert [name for name, _ in _versions(t2)] == ["b.json"]
    assert t2.batch["lost"] == {"records": 1, "detail": [f"{place.url}/b.json (overwritten before a plan read it)"],
                                "ranges": []}
    for t in (t1, t2):
        _run(coordinator, t.txid)
    assert table(dsn, "file_counts") == {"x": 1, "z": 2}
    assert coordinator.status("files").lost_records == 1
