"""store_dsn: a producer's script finds the state store where airflow-txn does -- the file the
demo's banner exports (mode 600), else $AIRFLOW_TXN_DSN -- and says what to export otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_transactional import store_dsn
from airflow_transactional.exceptions import ConfigError

pytestmark = pytest.mark.unit


def test_the_dsn_comes_from_the_banners_file_then_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_TXN_DSN_FILE", raising=False)
    monkeypatch.delenv("AIRFLOW_TXN_DSN", raising=False)
    with pytest.raises(ConfigError, match="export AIRFLOW_TXN_DSN_FILE=FILE"):
        store_dsn()
    monkeypatch.setenv("AIRFLOW_TXN_DSN", "dbname=from_variable")
    assert store_dsn() == "dbname=from_variable"
    kept = tmp_path / "state.dsn"
    kept.write_text("dbname=from_file password=secret\n")
    kept.chmod(0o644)
    monkeypatch.setenv("AIRFLOW_TXN_DSN_FILE", str(kept))
    with pytest.raises(ConfigError, match=f"chmod 600 {kept}"):
        store_dsn()
    kept.chmod(0o600)
    assert store_dsn() == "dbname=from_file password=secret"
