"""``python -m bench.check`` (``make bench-check``): the regression guard a developer runs before
committing a change to the processing or commit path -- anything under ``spark/``, ``core/commit*``,
``store/``, the operators.

It runs the ``work`` section of :mod:`bench.perf` (``--quick``: one 1,000,000-event batch, ours and
the Structured Streaming peer measured side by side in this run, trial by trial in turn, a few
minutes) and sets each of its ratios beside that row's *best* result from a clean commit, kept in
``docs/results/bench-budget.json`` -- never beside the last run, so that a row cannot creep a
little, "within the noise", on every change. A ratio is ours against a baseline measured in the
same run, so the machine's speed cancels out; what is left is this box's noise, about a tenth
between two runs of the same code here. A row worse than its best by more than the budget's
tolerance is flagged, and the exit code is 1: measure again, then look at the job's profile in the
table's notes. Paste the table into the commit message.

The budget only tightens: ``--record`` takes every row this run beat into it (a run of a clean
commit only: ``+changes`` in a result cannot be reproduced). Loosening a row takes ``--loosen
MEASURE --why TEXT``; the budget keeps the reason, and the commit message says it too.
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
from bench.measure import git_commit, is_clean

REPO = Path(__file__).resolve().parents[1]
BUDGET = REPO / "docs" / "results" / "bench-budget.json"
#: How far a ratio may move the wrong way from its best before the check says so, unless the
#: budget says otherwise (this box's noise between two runs of the same code is about a tenth).
TOLERANCE = 0.15
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
    """Each row of ``now`` beside the budget's (best) row of the same measure, with a verdict."""
    before = {str(r["measure"]): r for r in committed}
    out = []
    for row in now:
        if row.get("ratio") is None:
            continue
        measure, ratio = str(row["measure"]), float(row["ratio"])
        lower = lower_is_better(row)
        old = before.get(measure)
        if old is None or old.get("ratio") is None:
            out.append(Compared(measure, None, ratio, lower, "new: no best recorded to compare with"))
            continue
        base = float(old["ratio"])
        change = ratio / base - 1 if base else 0.0
        worse = change > tolerance if lower else change < -tolerance
        better = change < -tolerance if lower else change > tolerance
        verdict = ("WORSE than its best beyond the noise" if worse else "better than its best" if better
                   else "within the noise of its best")
        out.append(Compared(measure, base, ratio, lower, f"{verdict} ({change:+.0%})"))
    return out


def table(rows: Sequence[Compared]) -> str:
    head = ("row", "best", "now", "better when", "verdict")
    lines = [(r.measure, "-" if r.committed is None else f"{r.committed:.2f}x", f"{r.now:.2f}x",
              "lower" if r.lower_is_better else "higher", r.verdict) for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += ["| " + " | ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)) + " |" for line in lines]
    return "\n".join(out)


def tighten(budget: dict[str, Any], now: Sequence[Mapping[str, Any]], commit: str, started: str) -> list[str]:
    """Take every row of ``now`` that beat its best (or has none yet) into ``budget``; the measures taken."""
    rows = {str(r["measure"]): r for r in budget.setdefault("rows", [])}
    taken = []
    for row in now:
        if row.get("ratio") is None:
            continue
        measure, ratio = str(row["measure"]), float(row["ratio"])
        old = rows.get(measure)
        if old is not None and (ratio >= float(old["ratio"]) if lower_is_better(row) else ratio <= float(old["ratio"])):
            continue
        new = {"section": row["section"], "measure": measure, "ratio": round(ratio, 4),
               "target": row.get("target", ""), "commit": commit, "started": started}
        if old is None:
            budget["rows"].append(new)
        else:
            old.update(new)
        taken.append(measure)
    return taken


def loosen(budget: dict[str, Any], now: Sequence[Mapping[str, Any]], which: str, why: str, commit: str,
           started: str) -> str:
    """Set the one row whose measure starts with ``which`` to this run's ratio, keeping ``why``."""
    if not why.strip():
        raise ValueError("--loosen needs --why: the reason a best result no longer holds (say it in the commit "
                         "message too)")
    rows = ([r for r in budget.get("rows", []) if r["measure"] == which]
            or [r for r in budget.get("rows", []) if str(r["measure"]).startswith(which)])
    if len(rows) != 1:
        raise ValueError(f"--loosen {which!r} names {len(rows)} rows of the budget: give the start of one measure")
    row = rows[0]
    ratio = next((float(r["ratio"]) for r in now if r["measure"] == row["measure"] and r.get("ratio") is not None),
                 None)
    if ratio is None:
        raise ValueError(f"this run has no ratio for {row['measure']!r}")
    budget.setdefault("loosened", []).append({"measure": row["measure"], "from": row["ratio"],
                                               "to": round(ratio, 4), "why": why.strip(), "commit": commit,
                                               "on": started})
    row.update({"ratio": round(ratio, 4), "commit": commit, "started": started})
    return str(row["measure"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default=str(BUDGET), help="each row's best result (default: the committed one)")
    parser.add_argument("--report", help="judge this report (a --json of bench.perf) instead of running one")
    parser.add_argument("--record", action="store_true", help="take the rows this run beat into the budget")
    parser.add_argument("--loosen", metavar="MEASURE", help="set this row's best to this run's ratio (needs --why)")
    parser.add_argument("--why", default="", help="why --loosen: kept in the budget")
    args = parser.parse_args(argv)
    budget_path = Path(args.budget)
    budget = json.loads(budget_path.read_text())
    if (args.record or args.loosen) and not is_clean(git_commit()) and not args.report:
        parser.error("--record and --loosen take a run of a clean commit: commit (or stash) your changes first")
    if args.loosen and not args.why.strip():
        parser.error("--loosen needs --why: the reason a best result no longer holds")
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
    tolerance = float(budget.get("tolerance", TOLERANCE))
    now_rows = [r for r in now["rows"] if r["section"] in SECTIONS]
    rows = compare([r for r in budget["rows"] if r["section"] in SECTIONS], now_rows, tolerance)
    print(f"\nbench-check: {now.get('commit') or 'this tree'} against each row's best ({budget_path.name}); "
          f"tolerance {tolerance:.0%}\n")
    print(table(rows))
    updated = _update(args, budget, budget_path, now, now_rows)
    if updated or args.loosen:  # a refusal; or a row set to this run, on purpose
        return updated
    return 1 if any(r.verdict.startswith("WORSE") for r in rows) else 0


def _update(args: argparse.Namespace, budget: dict[str, Any], path: Path, now: Mapping[str, Any],
            rows: Sequence[Mapping[str, Any]]) -> int:
    """``--record`` / ``--loosen``: the budget rewritten (0), or the reason it was not (2)."""
    if not (args.record or args.loosen):
        return 0
    commit, started = str(now.get("commit") or "?"), str(now.get("started") or "")
    if not is_clean(commit):
        print(f"not recorded: the run measured {commit!r}, not a clean commit", file=sys.stderr)
        return 2
    try:
        said = ([f"loosened: {loosen(budget, rows, args.loosen, args.why, commit, started)}"] if args.loosen
                else [f"tightened: {m}" for m in tighten(budget, rows, commit, started)])
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    path.write_text(json.dumps(budget, indent=2) + "\n")
    print("\n".join(said) or "no row beat its best: the budget is unchanged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
