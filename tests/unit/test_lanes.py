"""``make test``'s two lanes (dev/lanes.py) on stand-in lanes: each its own process with its own
temporary directory, every line of its output named, kept in its log, and the suite failing when
any lane fails -- a lane that collects no test (pytest's exit code 5) included."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from dev import lanes

pytestmark = pytest.mark.unit


def stand_ins(monkeypatch: pytest.MonkeyPatch, codes: dict[str, int]) -> None:
    def argv(marker: str, args: Sequence[str]) -> list[str]:
        name = next(n for n, m in lanes.LANES.items() if m == marker)
        return [sys.executable, "-c", f"import os; print('{name} in', os.environ['TMPDIR']); "
                                      f"raise SystemExit({codes[name]})"]

    monkeypatch.setattr(lanes, "lane_argv", argv)


def test_the_lanes_run_apart_and_pass_only_together(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    stand_ins(monkeypatch, {"e2e": 0, "others": 0})
    assert lanes.run([], base=tmp_path) == 0
    out = capsys.readouterr().out
    for name in lanes.LANES:
        assert f"[{name}] {name} in {tmp_path / f'{name}-tmp'}\n" in out
        assert (tmp_path / f"{name}.log").read_text() == f"{name} in {tmp_path / f'{name}-tmp'}\n"


@pytest.mark.parametrize("codes", [{"e2e": 1, "others": 0}, {"e2e": 0, "others": 5}])
def test_a_failing_lane_or_one_without_tests_fails_the_suite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             codes: dict[str, int]) -> None:
    stand_ins(monkeypatch, codes)
    assert lanes.run([], base=tmp_path) == 1


def test_a_failed_lanes_verdict_is_repeated_after_both_lanes_end(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def argv(marker: str, args: Sequence[str]) -> list[str]:
        name = next(n for n, m in lanes.LANES.items() if m == marker)
        if name == "e2e":  # fails at once, its verdict printed long before the other lane ends
            return [sys.executable, "-c", "print('FAILED tests/e2e/test_x.py::test_y - assert 1 == 2'); "
                                          "raise SystemExit(1)"]
        return [sys.executable, "-c", "import time; time.sleep(1); print('614 passed')"]

    monkeypatch.setattr(lanes, "lane_argv", argv)
    assert lanes.run([], base=tmp_path) == 1
    tail = capsys.readouterr().out.splitlines()[-4:]
    assert tail[0] == "[e2e] FAILED tests/e2e/test_x.py::test_y - assert 1 == 2"
    assert not any("others" in line and "FAILED" in line for line in tail)
