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


def test_a_child_that_ended_unaccounted_does_not_eat_its_parents_time() -> None:
    """A parent ignoring SIGCHLD has its children reaped by the kernel, which adds their time to
    no one: the child's life before the window must not be taken from the parent's own burn."""
    script = (
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
        f"child = subprocess.Popen([sys.executable, '-c', {BURN!r} + 'print(1, flush=True)\\nsys.stdin.read()\\n'],\n"
        "                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)\n"
        "child.stdout.readline()\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "child.stdin.close()\n" + BURN +
        "while True:\n"
        "    try:\n        os.kill(child.pid, 0)\n    except ProcessLookupError:\n        break\n"
        "    time.sleep(0.01)\n"
        "print('done', flush=True)\n"
        "sys.stdin.read()\n"
    )
    script = script.replace("' + 'print(1", "' + 'import sys\\nprint(1")
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert parent.stdin is not None and parent.stdout is not None
    try:
        assert parent.stdout.readline().strip() == "ready"  # the child burnt before the window
        with RoleCpu() as cpu:
            parent.stdin.write("go\n")
            parent.stdin.flush()
            assert parent.stdout.readline().strip() == "done"  # the parent burnt, the child ended
    finally:
        parent.stdin.close()
        parent.wait()
    assert cpu.by_role["other"] >= 0.58, cpu.by_role  # the parent's burn, whole (others may add)
