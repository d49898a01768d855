"""The executor watch's patience (``AIRFLOW_TXN_NO_EXECUTOR_TIMEOUT``): seconds, 0 turns it off,
anything else is refused naming the setting."""

from __future__ import annotations

import pytest

from airflow_transactional.exceptions import ConfigError
from airflow_transactional.spark.watch import PATIENCE, PATIENCE_ENV, patience_from_env


@pytest.mark.parametrize(("raw", "patience"), [("", PATIENCE), ("0", 0.0), ("90", 90.0), (" 2.5 ", 2.5)])
def test_the_patience_is_seconds(monkeypatch: pytest.MonkeyPatch, raw: str, patience: float) -> None:
    monkeypatch.setenv(PATIENCE_ENV, raw)
    assert patience_from_env() == patience


@pytest.mark.parametrize("raw", ["ten", "-1", "1e", "5m", "nan"])
def test_a_patience_that_is_no_seconds_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch,
                                                                      raw: str) -> None:
    monkeypatch.setenv(PATIENCE_ENV, raw)
    with pytest.raises(ConfigError, match=f"{PATIENCE_ENV} is seconds"):
        patience_from_env()
