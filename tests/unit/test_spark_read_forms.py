"""What the Spark helper refuses before it starts any Spark work: JSON files without a record
schema to parse them into, and a reader returning records of a form validate does not know."""

from __future__ import annotations

import pytest

from airflow_transactional.exceptions import ConfigError
from airflow_transactional.sources import LandingDirectory
from airflow_transactional.spark.read import Records, read_landing
from airflow_transactional.spark.validate import validate


def test_json_files_without_a_record_schema_name_the_fix() -> None:
    batch = {"format": "json", "files": [{"path": "/landing/a.json"}]}
    with pytest.raises(ConfigError, match=r"need a record schema: run\(transform, schema="):
        read_landing(None, LandingDirectory("/landing"), batch, record_schema=None)  # type: ignore[arg-type]


def test_a_reader_returning_an_unknown_form_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown form 'xml'.*text, parsed or columns"):
        validate(Records(None, "xml"), "url string", ["url"])  # type: ignore[arg-type]


class _Columns:
    """Only the column names of a DataFrame: what the helper checks before any Spark work."""

    def __init__(self, *columns: str) -> None:
        self.columns = list(columns)


def test_output_and_request_frames_missing_columns_name_what_they_need() -> None:
    from airflow_transactional.spark.stage import decision_requests, output_events
    from airflow_transactional.spec import StateSpec

    with pytest.raises(ConfigError, match=r"output 'ledger' lacks columns \['payload'\]: it must have id"):
        output_events("t", "ledger", 2, _Columns("id", "key"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"events with a request column also need when .*decisions: \['pay'\]"):
        output_events("t", "ledger", 2, _Columns("id", "payload", "request"), ["pay"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"and decision \(the topology has several\)"):
        output_events("t", "ledger", 2, _Columns("id", "payload", "request", "when"),  # type: ignore[arg-type]
                      ["pay", "refund"])
    state = StateSpec("debits", {"account": "text"})
    with pytest.raises(ConfigError, match=r"decision 'pay' lacks columns \['amount'\]: it must have account, amount"):
        decision_requests("pay", state, _Columns("account", "id"))  # type: ignore[arg-type]
