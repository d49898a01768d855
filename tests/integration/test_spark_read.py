"""spark/read.py's executor side on a real Postgres (no Spark needed): an event log's LSN chunks
become Arrow batches of exactly the records the source's own ``read`` gives -- every awkward
payload intact, in LSN order, nothing past the range."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_transactional.sources import PostgresLogSource
from airflow_transactional.spark import read
from airflow_transactional.store.connection import connect
from tests.helpers import AWKWARD_PAYLOADS, make_log

pytestmark = pytest.mark.integration


def test_log_chunks_arrive_as_the_sources_own_records(dsn: str) -> None:
    make_log(dsn, "clicks", partitions=2).append([(f"e{i}", p) for i, p in enumerate(AWKWARD_PAYLOADS * 3)])
    source = PostgresLogSource("clicks")
    batch = {"ranges": [[0, 0, 20], [1, 2, 20]]}
    chunks = read._log_chunks(batch, size=4)
    assert len(chunks) > 2  # several chunks per partition
    ranges = pa.RecordBatch.from_pydict({"p": [c[0] for c in chunks], "lo": [c[1] for c in chunks],
                                         "hi": [c[2] for c in chunks]})
    got = pa.Table.from_batches(list(read._arrow_log_chunks(dsn, "airflow_txn", source.to_config(), [ranges])))
    assert got.schema.names == [read.OFFSET_COL, read.EVENT_ID_COL, "payload"]
    conn = connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            expected = [(r.offset, r.event_id, r.payload) for r in source.read(cur, "airflow_txn", "t", batch)]
    finally:
        conn.close()
    assert len(expected) == 20 + 18  # LSNs 1-20 and 3-20: nothing past either range
    assert list(zip(*(got.column(i).to_pylist() for i in range(3)), strict=True)) == expected
