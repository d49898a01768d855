"""store/rows.py: a row is matched to its type by the result's column names, never by position."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest

from airflow_transactional.store.rows import every, one, scalar

pytestmark = pytest.mark.unit


class Pair(NamedTuple):
    a: int
    b: str


class FakeCursor:
    """What the helpers read of a cursor: its rows and the names of its columns."""

    def __init__(self, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        self.description = [SimpleNamespace(name=c) for c in columns]
        self.rows = list(rows)

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows.pop(0) if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self.rows = self.rows, []
        return rows


def test_fields_are_matched_by_column_name_whatever_the_select_order() -> None:
    assert one(FakeCursor(["b", "a"], [("x", 1)]), Pair) == Pair(a=1, b="x")  # type: ignore[arg-type]
    assert every(FakeCursor(["b", "a"], [("x", 1), ("y", 2)]), Pair) == [Pair(1, "x"), Pair(2, "y")]  # type: ignore[arg-type]


def test_no_row_is_none_and_no_rows_an_empty_list() -> None:
    assert one(FakeCursor(["a", "b"], []), Pair) is None  # type: ignore[arg-type]
    assert every(FakeCursor(["a", "b"], []), Pair) == []  # type: ignore[arg-type]


def test_a_column_the_row_type_lacks_or_misses_is_an_error_not_a_shifted_field() -> None:
    with pytest.raises(TypeError):
        one(FakeCursor(["a", "c"], [(1, "x")]), Pair)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # a row longer than the columns named
        one(FakeCursor(["a"], [(1, "x")]), Pair)  # type: ignore[arg-type]


def test_scalar_wants_exactly_one_value() -> None:
    assert scalar(FakeCursor(["n"], [(7,)])) == 7  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected one value"):
        scalar(FakeCursor(["a", "b"], [(1, 2)]))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected one value"):
        scalar(FakeCursor(["n"], []))  # type: ignore[arg-type]


def test_a_failed_attempt_records_the_root_cause_of_a_jvm_error_first() -> None:
    from airflow_transactional.model import failure_text

    class Throwable:
        def __init__(self, text: str, cause: Throwable | None = None) -> None:
            self.text, self.cause = text, cause

        def getCause(self) -> Throwable | None:  # py4j spells Throwable.getCause so
            return self.cause

        def toString(self) -> str:
            return self.text

    class Py4JJavaError(Exception):  # what pyspark raises for an error of the JVM
        def __init__(self, java: Throwable) -> None:
            super().__init__("An error occurred while calling o869.getResult.\n: org.apache.spark.SparkException")
            self.java_exception = java

    chain = Throwable("org.apache.spark.SparkException: Exception thrown in awaitResult",
                      Throwable("org.apache.spark.SparkException: Job aborted",
                                Throwable("java.net.ConnectException: Connection refused")))
    text = failure_text(Py4JJavaError(chain))
    assert text.splitlines()[0] == "Py4JJavaError, caused by java.net.ConnectException: Connection refused"
    assert "o869.getResult" in text  # the whole error follows
    assert failure_text(ValueError("bad")) == "ValueError: bad"

    class Gone(Throwable):
        def getCause(self) -> Throwable | None:
            raise ConnectionError("the JVM is gone")

    assert failure_text(Py4JJavaError(Gone("x"))).startswith("Py4JJavaError: An error occurred")
