"""A local landing file over the scan cap (limits.SCAN_MAX_BYTES): a plan does not read it through
(a sparse terabyte would hold every plan past plan_timeout); it is known by its stat, as an object
past the cap on a store is by its version, and read once, by the processor."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import BatchUnavailable
from airflow_transactional.processing import process_batch
from tests.helpers import table
from tests.integration.test_landing_and_opaque import _commit_all, _fn, _land, _landing_topology

pytestmark = pytest.mark.integration


def test_a_file_over_the_scan_cap_is_planned_by_its_stat_unread_and_counted_once(
        coordinator: Coordinator, tmp_path: Path, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_transactional import limits
    from airflow_transactional.sources import landed

    monkeypatch.setattr(limits, "SCAN_MAX_BYTES", 64)
    scanned: list[int] = []
    scan = landed.scan
    monkeypatch.setattr(landed, "scan", lambda fd, longest: scanned.append(os.fstat(fd).st_size) or scan(fd, longest))
    _land(tmp_path, "small.json", ["a"])
    _land(tmp_path, "big.json", [f"user{i}" for i in range(10)])
    big = (tmp_path / "big.json").stat().st_size
    assert big > 64
    coordinator.register(_landing_topology(tmp_path))
    t1 = coordinator.plan("files", "r1")
    planned = {Path(f["path"]).name: f for f in t1.batch["files"]}
    assert planned["big.json"]["sha256"] is None and planned["small.json"]["sha256"] is not None
    assert big not in scanned  # the plan never read it
    process_batch(coordinator, "files", t1.txid, _fn)
    coordinator.commit("files", t1.txid)
    assert table(dsn, "file_counts") == {"a": 1, **{f"user{i}": 1 for i in range(10)}}
    _commit_all(coordinator, "r2")  # nothing new: the big file is not a new version while its stat holds
    assert table(dsn, "file_counts") == {"a": 1, **{f"user{i}": 1 for i in range(10)}}
    assert coordinator.status("files").lag == 0


def test_a_file_over_the_scan_cap_rewritten_in_place_after_planning_is_never_committed(
        coordinator: Coordinator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without a digest, its stat is what pins it: another size, mtime or inode under the planned
    # name is another version, never read as the planned one.
    from airflow_transactional import limits

    monkeypatch.setattr(limits, "SCAN_MAX_BYTES", 64)
    coordinator.register(_landing_topology(tmp_path))
    _land(tmp_path, "big.json", [f"user{i}" for i in range(10)])
    t1 = coordinator.plan("files", "r1")
    _land(tmp_path, "big.json", [f"USER{i}" for i in range(10)])  # same size, a new inode
    with pytest.raises(BatchUnavailable, match=r"big\.json"):
        process_batch(coordinator, "files", t1.txid, _fn)
