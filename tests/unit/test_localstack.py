"""dev/localstack.py: the REST client of the local Airflow stack."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_rest_client_lists_every_run_past_the_apis_page_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by the chaos soak: the API silently caps a page at [api] maximum_page_limit (100), so a
    # client asking for limit=1000 saw only the oldest 100 runs -- past run 100 the harness took
    # the pipeline for idle, triggered hundreds of runs and never saw the failed run it had to clear.
    from urllib.parse import parse_qs, urlsplit

    from dev.localstack import RestClient

    every = [{"dag_run_id": f"r{i:03d}", "state": "success"} for i in range(250)]

    def get(path: str) -> dict[str, object]:
        query = {k: int(v[0]) for k, v in parse_qs(urlsplit(path).query).items() if k in ("limit", "offset")}
        offset, limit = query.get("offset", 0), min(query.get("limit", 50), 100)  # what the api-server does
        return {"dag_runs": every[offset:offset + limit], "total_entries": len(every)}

    client = RestClient.__new__(RestClient)
    monkeypatch.setattr(client, "get", get, raising=False)
    assert client.runs("d") == every
    assert client.runs("d", limit=120) == every[:120]


def test_every_component_and_spark_driver_keeps_its_scratch_files_in_the_stacks_directory(tmp_path: object) -> None:
    """A Spark driver killed mid-batch leaves its spark-*, blockmgr-* and artifacts-* directories
    behind: under the stack's own directory (removed with it), not the system's temp directory."""
    from pathlib import Path

    from dev.localstack import LocalStack

    base = Path(str(tmp_path))
    (base / "stack").mkdir()
    env = LocalStack(base / "stack", base / "dags").env()
    scratch = str((base / "stack" / "tmp").resolve())
    assert env["TMPDIR"] == env["SPARK_LOCAL_DIRS"] == scratch  # Python's tempfile; Spark's local dirs
    assert env["SPARK_SUBMIT_OPTS"] == f"-Djava.io.tmpdir={scratch}"  # the driver JVM's own temp files
    assert env["AIRFLOW_TXN_SECRETS_DIR"] == f"{scratch}/secrets"  # a killed task's DSN file goes with the stack


@pytest.mark.parametrize("now", ["2026-11-26T23:52:10+00:00", "2026-11-27T11:30:00+00:00", "2026-12-31T12:00:59+00:00"])
def test_the_quiet_daily_schedule_fires_twelve_hours_from_now(now: str) -> None:
    # CI found it: a suite started before midnight on @daily got a second scheduled run (one txid
    # more than the deferred-waits test counted) when the date turned.
    from datetime import datetime, timedelta

    from croniter import croniter

    from dev.localstack import on_schedule, quiet_daily_schedule

    at = datetime.fromisoformat(now)
    cron = quiet_daily_schedule(at)
    following = croniter(cron, at).get_next(datetime)
    assert timedelta(hours=11, minutes=59) < following - at <= timedelta(hours=12)
    assert at - croniter(cron, at).get_prev(datetime) <= timedelta(hours=12, minutes=1)  # unpausing's run
    # A day's run on that schedule, as a test triggers it so that a backfill finds it.
    day = on_schedule(datetime(2025, 3, 1, tzinfo=at.tzinfo), cron)
    assert croniter(cron, day - timedelta(seconds=1)).get_next(datetime) == day


def test_a_kraft_cluster_id_never_reads_as_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    # CI found it: one id in 64 starts with "-", and kafka-storage format took it for a flag.
    import uuid

    from dev import kafka

    draws = iter([uuid.UUID(bytes=b"\xfb" + bytes(15)), uuid.UUID(bytes=bytes(16))])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(draws))
    assert kafka.cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"
    monkeypatch.undo()
    assert not any(kafka.cluster_id().startswith("-") for _ in range(2000))


def test_a_starting_stack_finds_its_scratch_directory_empty(tmp_path: object) -> None:
    """Regression: killed drivers' spark-* and blockmgr-* directories piled up in the demo's
    scratch directory across restarts."""
    from pathlib import Path

    from dev.localstack import LocalStack

    base = Path(str(tmp_path))
    stack = LocalStack(base / "stack", base / "dags")
    left = stack.scratch_dir / "spark-0b1c" / "userFiles-1"
    left.mkdir(parents=True)
    (left / "words.py").write_text("# a killed driver's copy\n")
    stack.fresh_scratch()
    assert stack.scratch_dir.is_dir() and list(stack.scratch_dir.iterdir()) == []
