"""spark/read.py on a real Postgres (no Spark needed): an event log's LSN chunks become Arrow
batches of exactly the records the source's own ``read`` gives -- every awkward payload intact,
in LSN order, nothing past the range; the driver's spool sweeps what killed jobs left."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_transactional.model import LogBatch, Range
from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spark import read
from airflow_transactional.spark.handoff import StoreFile
from airflow_transactional.store.connection import connect
from tests.helpers import AWKWARD_PAYLOADS, make_log

pytestmark = pytest.mark.integration


class _Given(StoreFile):
    """The store as an executor reaches it, here without Spark: the DSN itself."""

    def __init__(self, dsn: str) -> None:
        object.__setattr__(self, "name", "given")
        object.__setattr__(self, "_dsn", dsn)

    def dsn(self) -> str:
        return str(self._dsn)  # type: ignore[attr-defined]


def test_log_chunks_arrive_as_the_sources_own_records(dsn: str) -> None:
    make_log(dsn, "clicks", partitions=2).append([(f"e{i}", p) for i, p in enumerate(AWKWARD_PAYLOADS * 3)])
    source = PostgresLogSource("clicks")
    batch = LogBatch(log="clicks", ranges=(Range(0, 0, 20), Range(1, 2, 20)))
    chunks = read._log_chunks(batch, size=4)
    assert len(chunks) > 2  # several chunks per partition
    ranges = pa.RecordBatch.from_pydict({"p": [c[0] for c in chunks], "lo": [c[1] for c in chunks],
                                         "hi": [c[2] for c in chunks]})
    got = pa.Table.from_batches(list(read._arrow_log_chunks(_Given(dsn), "airflow_txn", source.to_config(), [ranges])))
    assert got.schema.names == [read.OFFSET_COL, read.EVENT_ID_COL, "payload"]
    conn = connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            expected = [(r.offset, r.event_id, r.payload) for r in source.read(cur, "airflow_txn", "t", batch)]
    finally:
        conn.close()
    assert len(expected) == 20 + 18  # LSNs 1-20 and 3-20: nothing past either range
    assert list(zip(*(got.column(i).to_pylist() for i in range(3)), strict=True)) == expected


def test_a_spool_that_a_killed_job_left_on_this_host_is_swept_by_the_next_one(dsn: str, tmp_path: Path) -> None:
    make_log(dsn, "clicks", partitions=1).append([("e1", '{"u": 1}'), ("e2", '{"u": 2}')])
    host = socket.gethostname()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process has now
    killed = f"txn-log-{host}-{gone.pid}-killed"
    left = {name: tmp_path / name for name in (killed, f"txn-log-{host}-{os.getpid()}-live",
                                               f"txn-log-other-host-{gone.pid}-remote", "txn-log-unnamed", "other")}
    for path in left.values():
        path.mkdir()
        (path / "0-0-2.csv").write_text("x")
    files = read.spool_log(PostgresLogSource("clicks"), [(0, 0, 2)], str(tmp_path), dsn=dsn, schema="airflow_txn")
    assert files is not None and len(files) == 1
    assert Path(files[0]).parent.name.startswith(f"txn-log-{host}-{os.getpid()}-")
    assert Path(files[0]).read_text().splitlines()[0] == '0:1,e1,"{""u"": 1}"'
    assert {name for name, path in left.items() if path.exists()} == set(left) - {killed}
