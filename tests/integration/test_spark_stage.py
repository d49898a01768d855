"""spark/stage.py's executor side on a real Postgres (no Spark needed): Arrow batches become CSV
COPY rows with every value intact -- NULL apart from the empty string, quotes, commas, tabs,
newlines, backslashes and ``\\N`` -- in one transaction however many chunks they are sent in."""

from __future__ import annotations

from decimal import Decimal

import psycopg2
import pyarrow as pa
import pytest
from psycopg2 import sql

from airflow_transactional.model import Staging
from airflow_transactional.spark import stage
from airflow_transactional.store import state as q
from tests.helpers import query

pytestmark = pytest.mark.integration

AWKWARD = ["plain", "", None, 'a "quoted", comma', "tab\there", "new\nline", "back\\slash", "\\N", "ünïcødé"]


def _table(dsn: str) -> str:
    query(dsn, "CREATE TABLE staged (txid bigint NOT NULL, attempt integer NOT NULL, k text, "
               "v numeric, n bigint)")
    conn = psycopg2.connect(dsn)
    try:
        return q.copy_into(sql.Identifier("staged"), ["txid", "attempt", "k", "v", "n"], csv=True).as_string(conn)
    finally:
        conn.close()


def _batch(keys: list[str | None]) -> pa.RecordBatch:
    values = [Decimal(i) / 4 if i % 3 else None for i in range(len(keys))]
    return pa.RecordBatch.from_arrays([pa.array(keys, pa.string()), pa.array(values, pa.decimal128(38, 10)),
                                       pa.array(range(len(keys)), pa.int64())], names=["k", "v", "n"])


def test_every_awkward_value_arrives_as_it_was(dsn: str) -> None:
    copy = _table(dsn)
    assert stage.copy_batches(dsn, Staging(copy, (7, 2)), [_batch(AWKWARD[:4]), _batch([]), _batch(AWKWARD[4:])]) == 9
    rows = query(dsn, "SELECT txid, attempt, k, v, n FROM staged ORDER BY ctid")
    assert [r[2] for r in rows] == AWKWARD
    assert {(r[0], r[1]) for r in rows} == {(7, 2)}
    assert [r[3] for r in rows] == [Decimal(i) / 4 if i % 3 else None for i in range(4)] + \
        [Decimal(i) / 4 if i % 3 else None for i in range(5)]


def test_chunks_are_one_transaction(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = _table(dsn)
    monkeypatch.setattr(stage, "COPY_CHUNK_BYTES", 64)  # a COPY per batch

    def batches() -> object:
        yield _batch([f"k{i}" for i in range(20)])
        yield _batch([f"k{i}" for i in range(20, 40)])
        raise RuntimeError("the executor died mid-partition")

    with pytest.raises(RuntimeError, match="mid-partition"):
        stage.copy_batches(dsn, Staging(copy, (1, 1)), batches())  # type: ignore[arg-type]
    assert query(dsn, "SELECT count(*) FROM staged") == [(0,)]  # the chunks sent were rolled back
    assert stage.copy_batches(dsn, Staging(copy, (1, 1)), [_batch([f"k{i}" for i in range(40)])] * 3) == 120
    assert query(dsn, "SELECT count(*), count(DISTINCT k) FROM staged") == [(120, 40)]
