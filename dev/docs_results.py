"""An MkDocs hook (``mkdocs.yml``): a page's ``<!-- results:NAME -->`` becomes the table of
``docs/results/NAME.json``, as the run that wrote it measured it -- no figure typed by hand, and
the date, commit and machine of the run beside it (``bench-*``: a ``bench.perf`` report). A marker
without its file fails the build."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
MARKER = re.compile(r"<!-- results:([a-z0-9-]+) -->")


def demo_soak(r: dict[str, Any]) -> str:
    """``python -m bench.demo_soak --json docs/results/demo-soak.json``."""
    rows = ["| topology | commits | drivers killed | largest lag by third of the run (records) | lag at the end | "
            "lag |", "| --- | ---: | ---: | --- | ---: | --- |"]
    for name, t in r["topologies"].items():
        thirds = " / ".join(f"{v:,}" for v in t["max_lag_by_third"])
        final = "-" if t["final_lag"] is None else f"{t['final_lag']:,}"
        rows.append(f"| `{name}` | {t['commits']} | {t['drivers_killed']} | {thirds} | {final} | {t['lag']} |")
    left = ", ".join(f"`{p}`" for p in r["left_in_temp"]) or "nothing"
    return "\n".join(rows) + (
        f"\n\n{r['minutes']:g} minutes at {r['rate']} tweets a second, a random topology's Spark driver SIGKILLed "
        f"every {r['kill_every_s']} s; the demo's exit code after Ctrl-C: {r['demo_exit_code']}; left in the "
        f"system temp directory: {left}.")


def bench(r: dict[str, Any]) -> str:
    """``python -m bench.perf --only SECTION --json docs/results/bench-SECTION.json --plot ''``."""
    rows = ["| what | ours | baseline | ratio | goal | met |", "| --- | ---: | ---: | ---: | --- | --- |"]
    for row in r["rows"]:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        met = "" if row["met"] is None else ("yes" if row["met"] else "**no**")
        rows.append(f"| {row['measure']} | {row['ours']} | {row['baseline']} | {ratio} | {row['target']} | {met} |")
    notes = [f"- {row['note']}" for row in r["rows"] if row["note"]]
    return "\n".join(rows) + ("\n\n" + "\n".join(notes) if notes else "")


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {"demo-soak": demo_soak}


def renderer(name: str) -> Callable[[dict[str, Any]], str]:
    """A file's renderer: ``bench-*`` are the benchmark's reports, the others by name."""
    if name.startswith("bench-"):
        return bench
    if name not in RENDERERS:
        raise ValueError(f"no table for results:{name}: one of {', '.join(sorted(RENDERERS))}, or bench-*")
    return RENDERERS[name]


def render(name: str) -> str:
    make = renderer(name)
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise ValueError(f"results:{name} needs {path}: run `{(make.__doc__ or '').strip('`. ')}`")
    r = json.loads(path.read_text())
    when = r.get("date") or r["started"]
    return (f"{make(r)}\n\n*Measured {when[:10]} at commit `{r['commit']}` on a "
            f"{r['machine']} machine ({path.relative_to(RESULTS.parents[1])}).*")


def on_page_markdown(markdown: str, **_kwargs: Any) -> str:
    return MARKER.sub(lambda m: render(m.group(1)), markdown)
