"""An MkDocs hook (``mkdocs.yml``): a page's ``<!-- results:NAME -->`` becomes the table of
``docs/results/NAME.json``, as the run that wrote it measured it -- no figure typed by hand, and
the date, commit and machine of the run beside it. ``bench*``: a ``bench.perf`` report, whose
``<!-- results:NAME:SECTION -->`` is one section's rows (``vs-structured-streaming`` for "vs
Structured Streaming"); ``chaos-*``: a ``bench.chaos`` report. A marker without its file, or a
section without rows, fails the build."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
MARKER = re.compile(r"<!-- results:([a-z0-9-]+)(?::([a-z0-9-]+))? -->")


def demo_soak(r: dict[str, Any]) -> str:
    """``python -m bench.demo_soak --spark-connect --kill-server-at 15 --json docs/results/demo-soak.json``."""
    rows = ["| topology | commits | batches killed | largest lag by third of the run (records) | lag at the end | "
            "lag | seconds between commits (median / largest) | txids seen with a failed try |",
            "| --- | ---: | ---: | --- | ---: | --- | --- | --- |"]
    for name, t in r["topologies"].items():
        thirds = " / ".join(f"{v:,}" for v in t["max_lag_by_third"])
        final = "-" if t["final_lag"] is None else f"{t['final_lag']:,}"
        gap = t.get("commit_gap_s")
        gaps = f"{gap['p50']:g} / {gap['max']:g}" if gap else "-"
        failed = "-"
        if t.get("failed_tries"):
            stuck = t["failed_uncommitted"]
            failed = (f"{', '.join(map(str, t['failed_tries']))}: "
                      + (f"**not committed at the end: {', '.join(map(str, stuck))}**" if stuck else "each committed"))
        elif "failed_tries" in t:
            failed = "none"
        rows.append(f"| `{name}` | {t['commits']} | {t['drivers_killed']} | {thirds} | {final} | {t['lag']} | {gaps} "
                    f"| {failed} |")
    left = ", ".join(f"`{p}`" for p in r["left_in_temp"]) or "nothing"
    connect = r.get("backend") == "spark-connect"
    killed = "Spark Connect client" if connect else "Spark driver"
    server = "".join(f"; the Spark Connect server SIGKILLed at minute {m:g}"
                     for m in r.get("connect_server_killed_at_min", []))
    return "\n".join(rows) + (
        f"\n\n{r['minutes']:g} minutes on {r.get('backend', 'spark-submit')} at {r['rate']} tweets a second, a random "
        f"topology's {killed} SIGKILLed every {r['kill_every_s']:g} s{server}; the demo's exit code after Ctrl-C: "
        f"{r['demo_exit_code']}; left in the system temp directory: {left}.")


def slug(section: str) -> str:
    return section.lower().replace(" ", "-")


def bench(r: dict[str, Any], section: str | None = None) -> str:
    """``python -m bench.perf --json docs/results/bench.json`` (``make bench``)."""
    chosen = [row for row in r["rows"] if section is None or slug(row["section"]) == section]
    if not chosen:
        known = sorted({slug(row["section"]) for row in r["rows"]})
        raise ValueError(f"the report has no rows of section {section!r}: one of {', '.join(known)}")
    rows = ["| what | ours | baseline | ratio | goal | met |", "| --- | ---: | ---: | ---: | --- | --- |"]
    for row in chosen:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        met = "" if row["met"] is None else ("yes" if row["met"] else "**no**")
        rows.append(f"| {row['measure']} | {row['ours']} | {row['baseline']} | {ratio} | {row['target']} | {met} |")
    notes = [f"- {row['note']}" for row in chosen if row["note"]]
    command = f"\n\n`{r['command']}`" if r.get("command") else ""  # reports before 2026-11-27 lack it
    return "\n".join(rows) + ("\n\n" + "\n".join(notes) if notes else "") + command


def chaos(r: dict[str, Any]) -> str:
    """``python -m bench.chaos [--mode MODE] [--quick] --json docs/results/chaos-NAME.json``."""
    rows = ["| check | result |", "| --- | --- |", *(f"| {check} | {result} |" for check, result in r["rows"])]
    found = [f"- **{p}**" for p in r["problems"]]
    note = f"\n\n{r['note']}" if r.get("note") else ""  # what the run's own record cannot say (its code)
    return "\n".join(rows + (["", *found] if found else [])) + f"\n\n`{r['command']}`{note}"


def big_object(r: dict[str, Any]) -> str:
    """``python -m bench.big_object --json docs/results/big-object.json``."""
    batches = " / ".join(", ".join(f"`{name}`" for name in b) for b in r["batches"])
    rows = ["| what | result |", "| --- | --- |",
            f"| the big object | {r['object_bytes']:,} bytes (ETag `{r['object_etag']}`) |",
            f"| batches (max_batch_bytes 1 GiB) | {batches} |",
            f"| what the plan said | {'; '.join(r['plan_said']) or 'nothing'} |",
            f"| lines written / counted | {r['lines_written']:,} / {r['lines_counted']:,} |",
            f"| sums per user equal to those written | {'yes' if r['sums_equal'] else '**no**'} |",
            *(f"| {step} | {secs:g} s |" for step, secs in r["seconds"].items()),
            f"| Spark CPU (every spark-submit's process tree) | {r['spark_cpu_seconds']:g} CPU-s |"]
    return "\n".join(rows) + f"\n\n`{r['command']}`"


RENDERERS: dict[str, Callable[..., str]] = {"demo-soak": demo_soak, "big-object": big_object}


def renderer(name: str) -> Callable[..., str]:
    """A file's renderer: ``bench*`` are the benchmark's reports, ``chaos-*`` the chaos harness's,
    the others by name."""
    if name == "bench" or name.startswith("bench-"):
        return bench
    if name.startswith("chaos-"):
        return chaos
    if name not in RENDERERS:
        raise ValueError(f"no table for results:{name}: one of {', '.join(sorted(RENDERERS))}, bench* or chaos-*")
    return RENDERERS[name]


def render(name: str, section: str | None = None) -> str:
    make = renderer(name)
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise ValueError(f"results:{name} needs {path}: run `{(make.__doc__ or '').strip('`. ')}`")
    if section is not None and make is not bench:
        raise ValueError(f"results:{name}:{section}: only a bench.perf report has sections")
    r = json.loads(path.read_text())
    when = r.get("date") or r["started"]
    table = make(r, section) if section is not None else make(r)
    return (f"{table}\n\n*Measured {when[:10]} at commit `{r['commit']}` on a "
            f"{r['machine']} machine ({path.relative_to(RESULTS.parents[1])}).*")


def on_page_markdown(markdown: str, **_kwargs: Any) -> str:
    return MARKER.sub(lambda m: render(m.group(1), m.group(2)), markdown)
