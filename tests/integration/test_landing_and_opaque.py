"""Landing-directory batches in arrival order, and opaque re-planning when retention removes a
planned, uncommitted batch: nothing skipped that still exists, nothing counted twice."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from pathlib import Path

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import BatchUnavailable, NotProcessed
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import LandingDirectory
from airflow_transactional.sources.landed import write_json_lines
from airflow_transactional.spec import StateSpec, TopologySpec
from tests.helpers import click, click_fn, counting_topology, make_log, query, run_one, table

pytestmark = pytest.mark.integration


def _landing_topology(path: Path, *, opaque: bool = False, max_files: int = 2) -> TopologySpec:
    return TopologySpec("files", LandingDirectory(str(path), max_files=max_files, settle_seconds=0),
                        [StateSpec("file_counts", {"user_id": "text"}, combiner="count",
                                   kind="opaque" if opaque else "transactional")],
                        opaque=opaque)


def _fn(r):  # type: ignore[no-untyped-def]
    return [("file_counts", (r["user"],), 1)]


def _land(path: Path, name: str, users: list[str], mtime: float | None = None) -> None:
    f = write_json_lines(str(path), name, [{"user": u} for u in users])
    if mtime is not None:
        os.utime(f, (mtime, mtime))


def test_files_are_batched_in_arrival_order_and_late_files_are_not_skipped(
        coordinator: Coordinator, tmp_path: Path, dsn: str) -> None:
    coordinator.register(_landing_topology(tmp_path))
    now = time.time()
    _land(tmp_path, "b.json", ["x"], now - 50)
    _land(tmp_path, "a.json", ["x", "y"], now - 40)
    _land(tmp_path, "c.json", ["y"], now - 30)
    (tmp_path / ".partial.json.tmp").write_text('{"user": "ignored"}\n')
    t1 = coordinator.plan("files", "r1")
    assert [Path(f["path"]).name for f in t1.batch["files"]] == ["b.json", "a.json"]
    # A file that lands now with an *older* mtime than everything planned is still picked up.
    _land(tmp_path, "late.json", ["z"], now - 100)
    t2 = coordinator.plan("files", "r2")
    assert [Path(f["path"]).name for f in t2.batch["files"]] == ["c.json", "late.json"]
    for t in (t1, t2):
        process_batch(coordinator, "files", t.txid, _fn)
        coordinator.commit("files", t.txid)
    assert table(dsn, "file_counts") == {"x": 2, "y": 2, "z": 1}
    assert coordinator.status("files").lag == 0


def test_transactional_landing_source_refuses_a_vanished_file(coordinator: Coordinator, tmp_path: Path) -> None:
    coordinator.register(_landing_topology(tmp_path))
    _land(tmp_path, "a.json", ["x"])
    t1 = coordinator.plan("files", "r1")
    (tmp_path / "a.json").unlink()
    with pytest.raises(BatchUnavailable, match="declare the topology opaque=True"):
        process_batch(coordinator, "files", t1.txid, _fn)


def test_opaque_landing_source_replans_from_the_checkpoint(coordinator: Coordinator, tmp_path: Path,
                                                           dsn: str) -> None:
    coordinator.register(_landing_topology(tmp_path, opaque=True, max_files=1))
    for n, users in enumerate([["a"], ["b"], ["c"], ["d"]]):
        _land(tmp_path, f"f{n}.json", users, time.time() - 100 + n)
    t1, t2, t3 = (coordinator.plan("files", f"r{k}") for k in range(3))
    process_batch(coordinator, "files", t3.txid, _fn)  # processed before the loss
    (tmp_path / "f0.json").unlink()  # retention removes txid 1's file before it committed
    process_batch(coordinator, "files", t1.txid, _fn)  # re-plans 1 and every later txid
    for t in (t2, t3):
        process_batch(coordinator, "files", t.txid, _fn)
    for t in (t1, t2, t3):
        coordinator.commit("files", t.txid)
    run_one(coordinator, "files", "r3", _fn)
    assert table(dsn, "file_counts") == {"b": 1, "c": 1, "d": 1}  # each surviving file once
    assert coordinator.status("files").lost_records == 1
    # The lost name landed again is a new file: counted, and what an audit or a rebuild recomputes
    # from holds it (only the lost version is skipped, not its name).
    _land(tmp_path, "f0.json", ["e"], time.time() - 50)
    run_one(coordinator, "files", "r4", _fn)
    assert table(dsn, "file_counts") == {"b": 1, "c": 1, "d": 1, "e": 1}
    batch, why_not = coordinator.committed_batch("files")
    assert why_not is None and sorted(os.path.basename(f["path"]) for f in batch.files) == [
        "f0.json", "f1.json", "f2.json", "f3.json"]


def _opaque_clicks(coordinator: Coordinator, dsn: str, n: int = 40):  # type: ignore[no-untyped-def]
    log = make_log(dsn, partitions=1)
    coordinator.register(counting_topology(opaque=True, kind="opaque", max_batch_size=10))
    log.append([click(i, user="u", amount=1) for i in range(n)], partition=0)
    return log


def _finish_and_check(coordinator: Coordinator, dsn: str, lost: int) -> None:
    while coordinator.status("clicks").lag:
        run_one(coordinator, "clicks", f"more{coordinator.status('clicks').committed_txid}")
    # Oracle by event id: every event still in the log counted exactly once; the lost reported.
    surviving = {eid for (eid,) in query(dsn, "SELECT event_id FROM airflow_txn.log_events")}
    assert table(dsn, "clicks_count") == {"u": len(surviving)}
    assert coordinator.status("clicks").lost_records == lost
    commits = coordinator.commits("clicks")
    for a, b in itertools.pairwise(commits):
        assert a["end_offsets"] == b["start_offsets"]  # contiguous: nothing skipped
    assert json.loads(json.dumps(commits[0]["start_offsets"])) == {"0": 0}
    # What an audit recomputes from: exactly the surviving events, none of the lost ones.
    batch, why_not = coordinator.committed_batch("clicks")
    assert why_not is None
    txn = coordinator.transaction("clicks", commits[-1]["txid"])
    audited = {r.event_id for r in coordinator.read_batch(dataclasses.replace(txn, batch=batch))}
    assert audited == surviving


def test_opaque_replan_drops_only_what_is_gone_and_later_txids_keep_their_output(
        coordinator: Coordinator, dsn: str) -> None:
    log = _opaque_clicks(coordinator, dsn)
    t1, t2, t3 = (coordinator.plan("clicks", f"r{k}") for k in range(3))
    for t in (t2, t3):
        process_batch(coordinator, "clicks", t.txid, click_fn)
    assert log.truncate(0, 4, force=True) == 4  # retention removes LSN 1..4 of txid 1's planned batch
    process_batch(coordinator, "clicks", t1.txid, click_fn)
    versions = [coordinator.transaction("clicks", t).plan_version for t in (1, 2, 3)]
    # txid 1 is re-planned within its old bounds; txids 2 and 3 are re-planned too and come out
    # the same, so the output they staged before the loss still commits.
    assert versions == [2, 1, 1]
    assert coordinator.transaction("clicks", 1).end_offsets == t1.end_offsets
    for t in (1, 2, 3):
        assert coordinator.commit("clicks", t).committed
    _finish_and_check(coordinator, dsn, lost=4)


def test_opaque_replan_reaches_a_later_txid_when_the_loss_does(coordinator: Coordinator, dsn: str) -> None:
    log = _opaque_clicks(coordinator, dsn)
    t1, t2, t3 = (coordinator.plan("clicks", f"r{k}") for k in range(3))
    for t in (t2, t3):
        process_batch(coordinator, "clicks", t.txid, click_fn)
    assert log.truncate(0, 15, force=True) == 15  # all of txid 1 and half of txid 2
    process_batch(coordinator, "clicks", t1.txid, click_fn)
    assert [coordinator.transaction("clicks", t).plan_version for t in (1, 2, 3)] == [2, 2, 1]
    coordinator.commit("clicks", 1)
    # txid 2 was processed under its old plan: that output can never commit.
    with pytest.raises(NotProcessed, match="no complete processing attempt of its current plan"):
        coordinator.commit("clicks", 2)
    process_batch(coordinator, "clicks", 2, click_fn)
    coordinator.commit("clicks", 2)
    coordinator.commit("clicks", 3)  # unaffected: its first attempt commits
    _finish_and_check(coordinator, dsn, lost=15)
    # Retention that removes *committed* events makes the state unrecomputable: the audit says so.
    log.truncate(0, 30, force=True)
    why_not = coordinator.committed_batch("clicks")[1]
    assert why_not is not None and "retention removed committed events (partition 0 LSN 16..30)" in why_not


def test_an_audit_refusal_names_every_partition_retention_removed_committed_events_from(
        coordinator: Coordinator, dsn: str) -> None:
    log = make_log(dsn, partitions=2)
    coordinator.register(counting_topology())
    for p in (0, 1):
        log.append([click(i + 100 * p) for i in range(10)], partition=p)
    while coordinator.status("clicks").lag:
        run_one(coordinator, "clicks", f"r{coordinator.status('clicks').committed_txid}")
    assert log.truncate(0, 4, force=True) == 4 and log.truncate(1, 6, force=True) == 6
    batch, why_not = coordinator.committed_batch("clicks")
    assert batch == {} and why_not is not None
    assert "retention removed committed events (partition 0 LSN 1..4, partition 1 LSN 1..6)" in why_not, why_not


# -- files known by content (production hardening) --------------------------------------------

def _commit_all(coordinator: Coordinator, *runs: str) -> None:
    for run in runs:
        t = coordinator.plan("files", run)
        process_batch(coordinator, "files", t.txid, _fn)
        coordinator.commit("files", t.txid)


def test_a_file_replaced_under_the_same_name_is_new_content_and_is_counted(
        coordinator: Coordinator, tmp_path: Path, dsn: str) -> None:
    coordinator.register(_landing_topology(tmp_path))
    _land(tmp_path, "daily.json", ["x"])
    _commit_all(coordinator, "r1")
    _land(tmp_path, "daily.json", ["y", "y"])  # tomorrow's export, same name
    assert coordinator.status("files").lag == 1
    _commit_all(coordinator, "r2")
    assert table(dsn, "file_counts") == {"x": 1, "y": 2}
    assert coordinator.status("files").lag == 0
    os.utime(tmp_path / "daily.json")  # touched: the same bytes are not counted again
    _commit_all(coordinator, "r3")
    assert table(dsn, "file_counts") == {"x": 1, "y": 2}


@pytest.mark.parametrize("opaque", [False, True])
def test_a_same_size_rewrite_after_planning_is_never_committed(
        coordinator: Coordinator, tmp_path: Path, dsn: str, opaque: bool) -> None:
    coordinator.register(_landing_topology(tmp_path, opaque=opaque))
    _land(tmp_path, "a.json", ["x", "x"])
    t1 = coordinator.plan("files", "r1")
    _land(tmp_path, "a.json", ["z", "z"])  # same size, other content
    assert (tmp_path / "a.json").stat().st_size == t1.batch["files"][0]["size"]
    if not opaque:
        with pytest.raises(BatchUnavailable, match=r"a\.json"):
            process_batch(coordinator, "files", t1.txid, _fn)
        return
    process_batch(coordinator, "files", t1.txid, _fn)  # re-planned without the old content
    coordinator.commit("files", t1.txid)
    _commit_all(coordinator, "r2")  # the new content is a new file
    assert table(dsn, "file_counts") == {"z": 2}


@pytest.mark.parametrize("opaque", [False, True])
def test_an_in_place_rewrite_that_restores_the_mtime_is_never_committed(
        coordinator: Coordinator, tmp_path: Path, dsn: str, opaque: bool) -> None:
    """Regression: rsync --inplace / cp -p rewrite a file's bytes in place (same inode, same size)
    and restore its mtime: the stat matched, and the new content was committed as the planned one."""
    coordinator.register(_landing_topology(tmp_path, opaque=opaque))
    _land(tmp_path, "a.json", ["x", "x"])
    t1 = coordinator.plan("files", "r1")
    path = tmp_path / "a.json"
    before = path.stat()
    with open(path, "r+b") as fh:  # same size, other bytes, in place
        text = fh.read()
        fh.seek(0)
        fh.write(text.replace(b'"x"', b'"z"'))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    if not opaque:
        with pytest.raises(BatchUnavailable, match=r"a\.json"):
            process_batch(coordinator, "files", t1.txid, _fn)
        return
    process_batch(coordinator, "files", t1.txid, _fn)  # re-planned without the old content
    coordinator.commit("files", t1.txid)
    _commit_all(coordinator, "r2")
    assert table(dsn, "file_counts") == {"z": 2}  # the new content, once, as a new file


def test_a_hard_link_to_a_file_elsewhere_is_not_taken(coordinator: Coordinator, tmp_path: Path, dsn: str) -> None:
    """Regression: a hard link in the directory to a file outside it was read; whoever may write into
    the directory could have a file processed that they may not read."""
    inside, outside = tmp_path / "in", tmp_path / "secret"
    inside.mkdir()
    outside.mkdir()
    _land(outside, "passwords.json", ["root"])
    os.link(outside / "passwords.json", inside / "leak.json")
    _land(inside, "real.json", ["x"])
    coordinator.register(_landing_topology(inside, max_files=10))
    _commit_all(coordinator, "r1")
    assert table(dsn, "file_counts") == {"x": 1}


def test_a_stored_batch_naming_a_file_outside_the_directory_is_never_read(
        coordinator: Coordinator, tmp_path: Path, dsn: str) -> None:
    """The plan is stored where other roles write: a path pointed elsewhere (another user's file)
    is refused before anything reads it, by processing and by an audit alike."""
    inside, outside = tmp_path / "in", tmp_path / "secret"
    inside.mkdir()
    outside.mkdir()
    _land(outside, "passwords.json", ["root"])
    _land(inside, "real.json", ["x"])
    coordinator.register(_landing_topology(inside))
    _commit_all(coordinator, "r1")
    _land(inside, "more.json", ["y"])
    t2 = coordinator.plan("files", "r2")
    query(dsn, "UPDATE airflow_txn.transactions SET batch = jsonb_set(batch, '{files,0,path}', to_jsonb(%s::text)) "
               "WHERE txid = %s", (str(outside / "passwords.json"), t2.txid))
    with pytest.raises(BatchUnavailable, match="outside the landing directory"):
        process_batch(coordinator, "files", t2.txid, _fn)
    query(dsn, "UPDATE airflow_txn.landing_files SET path = %s WHERE seq = 1", (str(outside / "passwords.json"),))
    assert "outside the landing directory" in (coordinator.committed_batch("files")[1] or "")
    assert table(dsn, "file_counts") == {"x": 1}


def test_a_file_still_changing_is_not_planned_until_it_settles(coordinator: Coordinator, tmp_path: Path) -> None:
    spec = _landing_topology(tmp_path)
    coordinator.register(dataclasses.replace(spec, source=LandingDirectory(str(tmp_path), settle_seconds=60)))
    _land(tmp_path, "old.json", ["x"], time.time() - 120)
    _land(tmp_path, "growing.json", ["y"])
    t1 = coordinator.plan("files", "r1")
    assert [Path(f["path"]).name for f in t1.batch["files"]] == ["old.json"]
    assert coordinator.status("files").lag == 2  # both are waiting to commit; one is not planned yet


def test_links_out_of_the_directory_and_bad_patterns_are_not_taken(coordinator: Coordinator, tmp_path: Path,
                                                                   dsn: str) -> None:
    inside, outside = tmp_path / "in", tmp_path / "secret"
    inside.mkdir()
    outside.mkdir()
    _land(outside, "passwords.json", ["root"])
    (inside / "leak.json").symlink_to(outside / "passwords.json")
    _land(inside, "real.json", ["x"])
    (inside / "alias.json").symlink_to(inside / "real.json")  # a link even within it: no link is a landed file
    coordinator.register(_landing_topology(inside, max_files=10))
    _commit_all(coordinator, "r1")
    assert table(dsn, "file_counts") == {"x": 1}
    assert query(dsn, "SELECT count(*) FROM airflow_txn.quarantine") == [(0,)]
    for bad in (123, "", "sub/*.json"):
        with pytest.raises(ValueError, match="landing pattern must be a file-name pattern"):
            LandingDirectory(str(inside), pattern=bad)  # type: ignore[arg-type]


def test_max_batch_size_caps_a_landing_batch_too(coordinator: Coordinator, tmp_path: Path) -> None:
    coordinator.register(dataclasses.replace(_landing_topology(tmp_path, max_files=10), max_batch_size=2))
    for n in range(5):
        _land(tmp_path, f"f{n}.json", ["x"], time.time() - 100 + n)
    assert len(coordinator.plan("files", "r1").batch["files"]) == 2


def test_a_name_swapped_for_a_link_between_the_check_and_the_read_reads_nothing_through_it(
        coordinator: Coordinator, tmp_path: Path, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: whoever may write into the landing directory flipped a planned name between a
    good file and a link to a file they may not read; the processor checked the name, then read it
    again by name, and committed the other file's first line to the quarantine (downloadable by
    every viewer of the DAG). The swap is made here right after the processor's check, and undone
    before its check after the read: what the reader gets is the planned file or nothing."""
    inside = tmp_path / "landing"
    inside.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-LINE not json\n")
    secret.chmod(0o600)
    _land(inside, "f.json", ["x"], time.time() - 10)
    coordinator.register(_landing_topology(inside))
    txn = coordinator.plan("files", "r1")
    name, kept = inside / "f.json", inside / ".kept"
    checks = {"n": 0}
    check = LandingDirectory.unavailable

    def swapping(self: LandingDirectory, *args: object, **kwargs: object) -> str | None:
        checks["n"] += 1
        if checks["n"] == 2:  # the check after the read: the writer puts the file back first
            name.unlink()
            kept.rename(name)
        why = check(self, *args, **kwargs)  # type: ignore[arg-type]
        if checks["n"] == 1:  # the writer's move, right after the check before the read
            name.rename(kept)
            name.symlink_to(secret)
        return why

    monkeypatch.setattr(LandingDirectory, "unavailable", swapping)
    with pytest.raises(BatchUnavailable, match=r"f\.json .* cannot be opened as a file of its own"):
        process_batch(coordinator, "files", txn.txid, _fn)
    monkeypatch.undo()
    name.unlink()
    kept.rename(name)
    assert not [r for (r,) in query(dsn, "SELECT record FROM airflow_txn.quarantine") if "SECRET" in (r or "")]
    process_batch(coordinator, "files", txn.txid, _fn)  # the planned file, read again: counted once
    coordinator.commit("files", txn.txid)
    assert table(dsn, "file_counts") == {"x": 1}
    assert not [r for (r,) in query(dsn, "SELECT record FROM airflow_txn.quarantine") if "SECRET" in (r or "")]


def test_a_planned_file_copied_back_with_the_same_bytes_is_still_the_planned_file(
        coordinator: Coordinator, tmp_path: Path, dsn: str) -> None:
    """The same bytes under a new inode (restored from a backup) are the same file: the reader,
    which checks it reads the planned file, takes it, as the plan's checks do."""
    _land(tmp_path, "f.json", ["x", "y"], time.time() - 10)
    coordinator.register(_landing_topology(tmp_path))
    txn = coordinator.plan("files", "r1")
    name = tmp_path / "f.json"
    content, stamp = name.read_bytes(), name.stat().st_mtime
    name.unlink()
    (tmp_path / ".restore.tmp").write_bytes(content)  # a new inode, the same bytes and mtime
    os.utime(tmp_path / ".restore.tmp", (stamp, stamp))
    (tmp_path / ".restore.tmp").rename(name)
    process_batch(coordinator, "files", txn.txid, _fn)
    coordinator.commit("files", txn.txid)
    assert table(dsn, "file_counts") == {"x": 1, "y": 1}

