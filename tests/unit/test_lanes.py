"""``make test``'s lanes (dev/lanes.py) on stand-in lanes: each its own process with its own
temporary directory, every line of its output named, kept in its log, and the suite failing when
any lane fails -- a lane that collects no test (pytest's exit code 5) included; and the real lanes'
selections, which together run every test of the suite once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from dev import lanes

pytestmark = pytest.mark.unit


def stand_ins(monkeypatch: pytest.MonkeyPatch, codes: dict[str, int]) -> None:
    def argv(name: str, args: Sequence[str]) -> list[str]:
        return [sys.executable, "-c", f"import os; print('{name} in', os.environ['TMPDIR']); "
                                      f"raise SystemExit({codes[name]})"]

    monkeypatch.setattr(lanes, "lane_argv", argv)


def test_the_lanes_run_apart_and_pass_only_together(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    stand_ins(monkeypatch, dict.fromkeys(lanes.LANES, 0))
    assert lanes.run([], base=tmp_path) == 0
    out = capsys.readouterr().out
    for name in lanes.LANES:
        assert f"[{name}] {name} in {tmp_path / f'{name}-tmp'}\n" in out
        assert (tmp_path / f"{name}.log").read_text() == f"{name} in {tmp_path / f'{name}-tmp'}\n"


@pytest.mark.parametrize("codes", [{"e2e": 1, "cluster": 0, "others": 0}, {"e2e": 0, "cluster": 0, "others": 5}])
def test_a_failing_lane_or_one_without_tests_fails_the_suite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             codes: dict[str, int]) -> None:
    stand_ins(monkeypatch, codes)
    assert lanes.run([], base=tmp_path) == 1


def test_a_failed_lanes_verdict_is_repeated_after_every_lane_ends(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def argv(name: str, args: Sequence[str]) -> list[str]:
        if name == "e2e":  # fails at once, its verdict printed long before the other lane ends
            return [sys.executable, "-c", "print('FAILED tests/e2e/test_x.py::test_y - assert 1 == 2'); "
                                          "raise SystemExit(1)"]
        return [sys.executable, "-c", "import time; time.sleep(1); print('614 passed')"]

    monkeypatch.setattr(lanes, "lane_argv", argv)
    assert lanes.run([], base=tmp_path) == 1
    tail = capsys.readouterr().out.splitlines()[-(len(lanes.LANES) + 2):]
    assert tail[0] == "[e2e] FAILED tests/e2e/test_x.py::test_y - assert 1 == 2"
    assert not any("others" in line and "FAILED" in line for line in tail)


#: Collects each selection given as a JSON list of argument lists in one process (Airflow, Spark's
#: client and the suite's modules imported once, not once per selection) and prints the test ids
#: of each as a JSON list of lists.
_COLLECT = """
import json, sys
import pytest

class Ids:
    def __init__(self):
        self.ids = []
    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]

found = []
for selection in json.loads(sys.argv[1]):
    ids = Ids()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *selection], plugins=[ids])
    if code != 0:
        sys.exit(f"collecting {selection} exited with {code}")
    found.append(ids.ids)
print("IDS " + json.dumps(found))
"""


def collected(*selections: Sequence[str]) -> list[set[str]]:
    """The test ids pytest collects for each selection, in one fresh process."""
    done = subprocess.run([sys.executable, "-c", _COLLECT, json.dumps([list(s) for s in selections])],
                          cwd=lanes.REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("IDS ")]
    return [set(ids) for ids in json.loads(line[4:])]


@pytest.fixture(scope="module")
def selected() -> dict[str, set[str]]:
    """The ids of the whole suite, each lane's, the unit folder's and the unit marker's there."""
    selections = {"the suite": ("tests",), **lanes.LANES,
                  "unit folder": ("tests/unit",), "unit marker": ("tests/unit", "-m", "unit")}
    return dict(zip(selections, collected(*selections.values()), strict=True))


def test_the_lanes_run_every_test_of_the_suite_once(selected: dict[str, set[str]]) -> None:
    ids = {name: selected[name] for name in lanes.LANES}
    suite = selected["the suite"]
    assert all(ids.values()), {name: len(found) for name, found in ids.items()}
    assert sum(len(found) for found in ids.values()) == len(suite)  # none in two lanes
    assert set().union(*ids.values()) == suite
    e2e = ids["e2e"]
    assert "tests/e2e/test_readme.py::test_the_readme_topology_example_commits_as_written" in e2e


def test_each_test_is_in_its_folders_tier(selected: dict[str, set[str]]) -> None:
    """Regression: six modules had no ``pytestmark``: ``make test TIER=unit`` skipped 15 tests (two
    house rules among them) and the README's example ran in the wrong lane."""
    everything, marked = selected["unit folder"], selected["unit marker"]
    assert everything and marked == everything
    assert "tests/unit/test_queries.py" in {i.split("::")[0] for i in marked}


def test_a_lanes_minutes_are_told_file_by_file_from_its_junit_xml(tmp_path: Path) -> None:
    junit = tmp_path / "e2e.xml"
    junit.write_text('<testsuites><testsuite name="pytest">'
                     '<testcase classname="tests.e2e.test_chaos" name="test_a" time="120.5"/>'
                     '<testcase classname="tests.e2e.test_chaos" name="test_b" time="60"/>'
                     '<testcase classname="tests.unit.test_x.TestY" name="test_c" time="0.25"/>'
                     '</testsuite></testsuites>')
    assert lanes.slowest_files(junit) == [("tests/e2e/test_chaos.py", 180.5), ("tests/unit/test_x.py", 0.25)]
    assert lanes.slowest_files(junit, most=1) == [("tests/e2e/test_chaos.py", 180.5)]
    assert lanes.slowest_files(tmp_path / "none.xml") == []  # a lane that wrote none (killed early)
