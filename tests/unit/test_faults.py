"""Fault points cost nothing in production: without an engine installed at start-up, a point does
nothing even when faults are armed in the environment; with one, it fires."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from airflow_transactional import faults as points
from dev import faults

pytestmark = pytest.mark.unit

PROBE = ("from airflow_transactional import faults\n"
         "faults.point('probe.here', scope=('t', '7'))\n"
         "print('survived')\n")


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)


def _without_engine() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != points.ENGINE_ENV}


def test_an_armed_fault_does_nothing_without_an_engine() -> None:
    out = _run({**_without_engine(), faults.ENV: "probe.here=exit"})
    assert out.returncode == 0 and out.stdout.strip() == "survived"


def test_the_engine_installed_at_start_up_fires_a_scoped_point() -> None:
    out = _run(faults.child_env(_without_engine(), faults="probe.here:t:7=exit"))
    assert out.returncode == 137 and "survived" not in out.stdout
    other_txid = _run(faults.child_env(_without_engine(), faults="probe.here:t:8=exit"))
    assert other_txid.returncode == 0


def test_an_exit_in_the_triggerer_raises_instead_of_taking_every_trigger() -> None:
    as_triggerer = PROBE.replace("faults.point", "import sys; sys.argv[1:] = ['triggerer']; faults.point")
    probe = [sys.executable, "-c", as_triggerer]
    out = subprocess.run(probe, env=faults.child_env(_without_engine(), faults="probe.here=exit"), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1 and "InjectedFault" in out.stderr and "in the triggerer" in out.stderr, out.stderr


def test_inject_arms_a_point_in_process_for_a_block_only() -> None:
    with faults.inject("probe.inline", "raise@1"), pytest.raises(faults.InjectedFault):
        points.point("probe.inline")
    points.point("probe.inline")  # disarmed after the block


def test_an_unknown_action_names_the_ones_there_are() -> None:
    with faults.inject("probe.bad", "explode"), pytest.raises(ValueError, match="use exit, terminate, raise"):
        points.point("probe.bad")
