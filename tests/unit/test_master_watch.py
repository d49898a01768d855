"""The process task's watch of a driver's Spark standalone master (``masterwatch``): a driver no
master takes back within the timeout is killed (its try fails, the retry starts a new driver); one a
recovered master takes back goes on."""

from __future__ import annotations

import logging
import time

import pytest

from airflow_transactional.airflow.operators.masterwatch import DISCONNECTED, RECONNECTED, MasterWatch

pytestmark = pytest.mark.unit

LOST = f"14:01:41 WARN StandaloneSchedulerBackend: {DISCONNECTED}..."
BACK = f"14:01:44 INFO StandaloneAppClient$ClientEndpoint: {RECONNECTED} spark://127.0.0.1:7077"


def watch(timeout: float) -> tuple[MasterWatch, list[str]]:
    killed: list[str] = []
    return MasterWatch(lambda: killed.append("spark-submit"), logging.getLogger("test"), timeout), killed


def test_a_driver_no_master_takes_back_is_killed_after_the_timeout(caplog: pytest.LogCaptureFixture) -> None:
    w, killed = watch(0.2)
    w.see("14:01:40 INFO StandaloneAppClient$ClientEndpoint: Executor added: app-1/0")
    w.see(LOST)
    w.see(LOST)  # the driver says it twice: one timer
    time.sleep(0.05)
    assert killed == []
    time.sleep(0.4)
    assert killed == ["spark-submit"] and w.gave_up
    assert "run it with spark.deploy.recoveryMode" in caplog.text


def test_a_driver_a_recovered_master_takes_back_goes_on() -> None:
    w, killed = watch(0.2)
    w.see(LOST)
    w.see(BACK)
    time.sleep(0.4)
    assert killed == [] and not w.gave_up
    w.see(LOST)  # lost again later: watched again
    w.stop()  # the driver ended: nothing more to watch
    time.sleep(0.4)
    assert killed == []
