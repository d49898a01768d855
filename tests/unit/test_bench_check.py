"""bench/check.py: each ratio of a run beside the committed report's, judged the way its row should
move (its target's direction, else CPU and seconds down, events per second up)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import check

pytestmark = pytest.mark.unit

CPU = "CPU-seconds of one 1,000,000-event batch, ours vs the peer"
RATE = "events/s of one 1,000,000-event batch, Postgres event-log source vs landing directory"
CONNECT = "CPU-seconds of one 1,000,000-event batch on Spark Connect vs the peer"


def _rows(cpu: float, rate: float, connect: float | None) -> list[dict[str, object]]:
    return [{"section": "work", "measure": CPU, "ratio": cpu, "target": "<= 1.0x"},
            {"section": "work", "measure": RATE, "ratio": rate, "target": ">= 0.8x"},
            {"section": "work", "measure": CONNECT, "ratio": connect, "target": ""}]


def test_a_row_is_worse_only_beyond_the_noise_and_in_its_own_direction() -> None:
    verdicts = {c.measure: c.verdict for c in check.compare(_rows(1.40, 0.96, 0.84), _rows(1.88, 1.13, 0.89))}
    assert verdicts[CPU].startswith("WORSE") and "+34%" in verdicts[CPU]  # CPU up by a third
    assert verdicts[RATE].startswith("within the noise")  # events/s up 18%: better, inside the noise
    assert verdicts[CONNECT].startswith("within the noise")
    verdicts = {c.measure: c.verdict for c in check.compare(_rows(1.40, 0.96, 0.84), _rows(0.90, 0.60, 1.2))}
    assert verdicts[CPU].startswith("better") and verdicts[RATE].startswith("WORSE")
    assert verdicts[CONNECT].startswith("WORSE")  # no target: CPU-seconds should fall


def test_the_command_compares_a_report_and_exits_1_on_a_regression(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    committed, now = tmp_path / "committed.json", tmp_path / "now.json"
    committed.write_text(json.dumps({"started": "then", "commit": "abc", "rows": _rows(1.40, 0.96, 0.84)}))
    now.write_text(json.dumps({"commit": "def", "rows": _rows(1.45, 0.97, None)}))
    assert check.main(["--committed", str(committed), "--report", str(now)]) == 0
    out = capsys.readouterr().out
    assert "| " + CPU in out and "1.40x" in out and "1.45x" in out and CONNECT not in out  # no ratio: no row
    now.write_text(json.dumps({"commit": "def", "rows": _rows(2.0, 0.97, 0.84)}))
    assert check.main(["--committed", str(committed), "--report", str(now)]) == 1


def test_the_committed_report_has_the_rows_the_check_compares() -> None:
    rows = json.loads(check.COMMITTED.read_text())["rows"]
    assert [r for r in rows if r["section"] in check.SECTIONS and r.get("ratio") is not None]
