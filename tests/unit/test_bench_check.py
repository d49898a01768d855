"""bench/check.py: each ratio of a run beside that row's best from a clean commit (the committed
budget), judged the way its row should move (its target's direction, else CPU and seconds down,
events per second up); a budget that only tightens, and no committed result from a tree with
changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import check, measure, perf
from bench.measure import is_clean

pytestmark = pytest.mark.unit

CPU = "CPU-seconds of one 1,000,000-event batch, ours vs the peer"
RATE = "events/s of one 1,000,000-event batch, Postgres event-log source vs landing directory"
CONNECT = "CPU-seconds of one 1,000,000-event batch on Spark Connect vs the peer"


def _rows(cpu: float, rate: float, connect: float | None) -> list[dict[str, object]]:
    return [{"section": "work", "measure": CPU, "ratio": cpu, "target": "<= 1.0x"},
            {"section": "work", "measure": RATE, "ratio": rate, "target": ">= 0.8x"},
            {"section": "work", "measure": CONNECT, "ratio": connect, "target": ""}]


def test_a_row_is_worse_only_beyond_the_noise_and_in_its_own_direction() -> None:
    verdicts = {c.measure: c.verdict for c in check.compare(_rows(1.40, 0.96, 0.84), _rows(1.88, 1.13, 0.89), 0.2)}
    assert verdicts[CPU].startswith("WORSE") and "+34%" in verdicts[CPU]  # CPU up by a third
    assert verdicts[RATE].startswith("within the noise")  # events/s up 18%: better, inside the noise
    assert verdicts[CONNECT].startswith("within the noise")
    verdicts = {c.measure: c.verdict for c in check.compare(_rows(1.40, 0.96, 0.84), _rows(0.90, 0.60, 1.2), 0.2)}
    assert verdicts[CPU].startswith("better") and verdicts[RATE].startswith("WORSE")
    assert verdicts[CONNECT].startswith("WORSE")  # no target: CPU-seconds should fall


def test_the_command_compares_a_report_and_exits_1_on_a_regression(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    committed, now = tmp_path / "budget.json", tmp_path / "now.json"
    committed.write_text(json.dumps({"tolerance": 0.2, "rows": _rows(1.40, 0.96, 0.84)}))
    now.write_text(json.dumps({"commit": "def", "rows": _rows(1.45, 0.97, None)}))
    assert check.main(["--budget", str(committed), "--report", str(now)]) == 0
    out = capsys.readouterr().out
    assert "| " + CPU in out and "1.40x" in out and "1.45x" in out and CONNECT not in out  # no ratio: no row
    now.write_text(json.dumps({"commit": "def", "rows": _rows(2.0, 0.97, 0.84)}))
    assert check.main(["--budget", str(committed), "--report", str(now)]) == 1


def test_the_committed_budget_has_every_row_the_check_compares_from_a_clean_commit() -> None:
    budget = json.loads(check.BUDGET.read_text())
    measured = {r["measure"] for r in json.loads((check.BUDGET.parent / "bench.json").read_text())["rows"]
                if r["section"] in check.SECTIONS and r.get("ratio") is not None}
    assert measured and measured <= {r["measure"] for r in budget["rows"]}
    assert all(is_clean(r["commit"]) for r in budget["rows"])
    assert all(x["why"].strip() for x in budget["loosened"])


def test_a_row_that_creeps_run_by_run_is_caught_against_its_best(tmp_path: Path) -> None:
    """Regression: each run was judged against the last committed one, so 0.93 -> 1.00 -> 1.07 ->
    1.13 -> 1.16 passed step by step, every step within the noise."""
    budget, now = tmp_path / "budget.json", tmp_path / "now.json"
    budget.write_text(json.dumps({"tolerance": 0.15, "rows": _rows(0.93, 0.96, 0.84), "loosened": []}))
    codes = []
    for cpu in (1.00, 1.06, 1.13):
        now.write_text(json.dumps({"commit": f"c{cpu}", "started": "now", "rows": _rows(cpu, 0.96, 0.84)}))
        codes.append(check.main(["--budget", str(budget), "--report", str(now), "--record"]))
    assert codes == [0, 0, 1]  # +8%, +14%: within; +22% of the best: worse
    assert json.loads(budget.read_text())["rows"][0]["ratio"] == 0.93  # a worse run never loosens it


def test_record_tightens_from_a_clean_commit_only_and_loosen_keeps_its_reason(tmp_path: Path) -> None:
    budget, now = tmp_path / "budget.json", tmp_path / "now.json"
    budget.write_text(json.dumps({"rows": _rows(1.0, 0.9, 0.8), "loosened": []}))
    now.write_text(json.dumps({"commit": "abc+changes", "started": "now", "rows": _rows(0.5, 0.9, 0.8)}))
    assert check.main(["--budget", str(budget), "--report", str(now), "--record"]) == 2
    assert json.loads(budget.read_text())["rows"][0]["ratio"] == 1.0
    now.write_text(json.dumps({"commit": "abc", "started": "now", "rows": _rows(0.5, 0.95, 0.9)}))
    assert check.main(["--budget", str(budget), "--report", str(now), "--record"]) == 0
    rows = json.loads(budget.read_text())["rows"]
    assert [(r["ratio"], r.get("commit")) for r in rows] == [(0.5, "abc"), (0.95, "abc"), (0.8, None)]
    now.write_text(json.dumps({"commit": "def", "started": "later", "rows": _rows(0.7, 0.95, 0.8)}))
    with pytest.raises(SystemExit):
        check.main(["--budget", str(budget), "--report", str(now), "--loosen", CPU])  # no --why
    assert check.main(["--budget", str(budget), "--report", str(now), "--loosen", "CPU-seconds of one",
                       "--why", "x"]) == 2  # two rows start so: name one
    assert check.main(["--budget", str(budget), "--report", str(now), "--loosen", CPU, "--why",
                       "the work row now counts the staging"]) == 0
    after = json.loads(budget.read_text())
    assert after["rows"][0]["ratio"] == 0.7
    assert after["loosened"] == [{"measure": CPU, "from": 0.5, "to": 0.7, "why": "the work row now counts the staging",
                                  "commit": "def", "on": "later"}]


def test_no_committed_result_is_written_from_a_tree_with_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "git_commit", lambda: "abc+changes")
    assert "committed result" in (measure.dirty_result(str(measure.RESULTS / "bench.json")) or "")
    assert measure.dirty_result("/tmp/bench.json") is None
    with pytest.raises(SystemExit):
        perf.main(["--only", "work", "--json", str(measure.RESULTS / "bench.json"), "--plot", ""])
    monkeypatch.setattr(measure, "git_commit", lambda: "abc")
    assert measure.dirty_result(str(measure.RESULTS / "bench.json")) is None
