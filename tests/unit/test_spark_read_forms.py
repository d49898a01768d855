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
