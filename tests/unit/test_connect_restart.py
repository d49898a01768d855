"""The demo's Spark Connect server: started again when it exits (a real process), and chosen on a
machine of few cores unless the user says otherwise."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from dev import demo
from dev.localstack import SPARK_CONNECT

pytestmark = pytest.mark.unit


class _Stack:
    """What the demo's supervision uses of its stack: its processes and ``start_component``."""

    def __init__(self, proc: subprocess.Popen[bytes], base_dir: Any) -> None:
        self.procs = {SPARK_CONNECT: proc}
        self.base_dir = base_dir
        self.started: list[str] = []

    def start_component(self, name: str) -> None:
        self.started.append(name)


def test_the_demo_starts_its_spark_connect_server_again_when_it_exits(tmp_path: Any) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(137)"], start_new_session=True)
    gone.wait()
    stack = _Stack(gone, tmp_path)
    assert demo.revive_spark_connect(stack) is True  # type: ignore[arg-type]
    assert stack.started == [SPARK_CONNECT]
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        running = _Stack(alive, tmp_path)
        assert demo.revive_spark_connect(running) is False  # type: ignore[arg-type]
        assert running.started == []
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.parametrize(("argv", "cores", "connect"), [
    ([], 2, True), ([], 8, False), (["--spark-submit"], 2, False), (["--spark-connect"], 8, True),
    (["--cluster"], 2, False),
])
def test_the_demo_runs_on_spark_connect_on_a_small_machine_unless_told(monkeypatch: pytest.MonkeyPatch,
                                                                        argv: list[str], cores: int,
                                                                        connect: bool) -> None:
    monkeypatch.setattr(demo.os, "cpu_count", lambda: cores)
    args = demo.parse_args(argv)
    assert args.spark_connect is connect
    assert args.connect_chosen_for == (cores if connect and not argv else None)
