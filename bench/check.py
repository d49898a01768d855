"""``python -m bench.check`` (``make bench-check``): the regression guard a developer runs before
committing a change to the processing or commit path -- anything under ``spark/``, ``core/commit*``,
``store/``, the operators.

It runs the ``work`` section of :mod:`bench.perf` (``--quick``: one 1,000,000-event batch, ours and
the Structured Streaming peer measured side by side in this run, a few minutes) and sets each of
its ratios beside the same row of the committed report, ``docs/results/bench.json`` (the last full
``make bench``). A ratio is ours against a baseline measured in the same run, so the machine's
speed cancels out; what is left is this box's noise, about a tenth between two runs of the same
code here. A row that moved the wrong way by more than :data:`TOLERANCE` is flagged, and the exit
code is 1: measure again, then look at the job's profile in the table's notes. Paste the table into
the commit message.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bench import perf

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "docs" / "results" / "bench.json"
#: How far a ratio may move the wrong way before the check says so (this box's noise between two
#: runs of the same code is about a tenth).
TOLERANCE = 0.20
SECTIONS = ("work",)


class Compared(NamedTuple):
    measure: str
    committed: float | None
    now: float | None
    lower_is_better: bool
    verdict: str


def lower_is_better(row: Mapping[str, Any]) -> bool:
    """Which way a row's ratio should go: its target says (``<=``), else what it counts -- CPU and
    seconds should fall, events per second rise."""
    target = str(row.get("target") or "")
    if target.startswith(("<=", "<")):
        return True
    if target.startswith((">=", ">")):
        return False
    return "events/s" not in str(row.get("measure", ""))


def compare(committed: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]],
            tolerance: float = TOLERANCE) -> list[Compared]:
    """Each row of ``now`` beside the committed row of the same measure, with a verdict."""
    before = {str(r["measure"]): r for r in committed}
    out = []
    for row in now:
        if row.get("ratio") is None:
            continue
        measure, ratio = str(row["measure"]), float(row["ratio"])
        lower = lower_is_better(row)
        old = before.get(measure)
        if old is None or old.get("ratio") is None:
            out.append(Compared(measure, None, ratio, lower, "new: nothing committed to compare with"))
            continue
        base = float(old["ratio"])
        change = ratio / base - 1 if base else 0.0
        worse = change > tolerance if lower else change < -tolerance
        better = change < -tolerance if lower else change > tolerance
        verdict = ("WORSE than committed beyond the noise" if worse else "better than committed" if better
                   else "within the noise")
        out.append(Compared(measure, base, ratio, lower, f"{verdict} ({change:+.0%})"))
    return out


def table(rows: Sequence[Compared]) -> str:
    head = ("row", "committed", "now", "better when", "verdict")
    lines = [(r.measure, "-" if r.committed is None else f"{r.committed:.2f}x", f"{r.now:.2f}x",
              "lower" if r.lower_is_better else "higher", r.verdict) for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += ["| " + " | ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)) + " |" for line in lines]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--committed", default=str(COMMITTED), help="the report to compare with")
    parser.add_argument("--report", help="compare this report (a --json of bench.perf) instead of running one")
    args = parser.parse_args(argv)
    committed = json.loads(Path(args.committed).read_text())
    if args.report:
        now = json.loads(Path(args.report).read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="txn-bench-check-") as tmp:
            out = Path(tmp) / "now.json"
            code = perf.main(["--quick", "--only", ",".join(SECTIONS), "--json", str(out), "--plot", ""])
            if code != 0 or not out.exists():
                print("the benchmark run failed: see its output above", file=sys.stderr)
                return 2
            now = json.loads(out.read_text())
    rows = compare([r for r in committed["rows"] if r["section"] in SECTIONS],
                   [r for r in now["rows"] if r["section"] in SECTIONS])
    print(f"\nbench-check: {now.get('commit') or 'this tree'} against {Path(args.committed).name} of "
          f"{committed.get('started')} ({committed.get('commit') or '?'}); tolerance {TOLERANCE:.0%}\n")
    print(table(rows))
    return 1 if any(r.verdict.startswith("WORSE") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
