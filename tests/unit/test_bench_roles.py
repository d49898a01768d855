"""bench/roles.py: the CPU of processes that start and end between the two snapshots is counted
once, in the role of the process that reaps them; a burning process is found by its role."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.roles import RoleCpu

pytestmark = pytest.mark.unit

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"


def test_a_child_that_ended_counts_once_for_the_process_that_reaped_it() -> None:
    with RoleCpu() as cpu:
        subprocess.run([sys.executable, "-c", BURN], check=True)
    assert 0.58 <= cpu.by_role["benchmark"] < 1.6, cpu.by_role  # the burn (+ start-up), once, to a clock tick


def test_a_process_alive_at_both_snapshots_counts_its_difference() -> None:
    script = "import sys\nsys.stdin.readline()\n" + BURN + "print('burnt', flush=True)\nsys.stdin.read()\n"
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        with RoleCpu() as cpu:
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "burnt"  # it burnt within the window, and lives on
    finally:
        child.stdin.close()
        child.wait()
    assert cpu.by_role["other"] >= 0.58, cpu.by_role  # its burn, to a clock tick; no known role (others may add)
    assert cpu.by_role["benchmark"] < 0.5, cpu.by_role  # not ours: it was not reaped in the window
