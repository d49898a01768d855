"""Benchmarks against what users would pick instead, measured side by side in one run.

    python -m bench.perf [--quick] [--dir DIR] [--json FILE] [--plot FILE] [--only SECTION,...]

Everything runs on this machine in this one invocation -- one embedded Postgres, one Airflow
(api-server, scheduler, dag-processor, triggerer; LocalExecutor), real ``spark-submit`` --
and every result is a ratio against a baseline measured in the same run. A section a module
(``bench/sections/<name>.py``, whose docstring says what it measures against what), in the order
a run takes them:

- on the state store and one ``spark-submit``, before Airflow starts: ``commit``, ``decisions``,
  ``plan``, ``startup``, ``work``, ``evolution``, ``objects`` (on an S3 server and an HDFS of its own), ``kafka``
  (on a broker of its own), and the peer's half of
  ``peer`` (Structured Streaming alone on the machine);
- on the benchmark's Airflow (:mod:`bench.harness`): ``overhead``, ``pipelining`` and our half of
  ``peer`` (each backend), ``waits``, ``scale``, and the LocalExecutor half of ``cluster``;
- on stacks of their own, after that Airflow stopped: the cluster stack's half of ``cluster``, and
  ``latency`` (the payments example);
- and the peak memory (RSS) of every Spark process tree the run measured.

It prints the table and writes a PNG plot of the ratios against their targets.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from airflow_transactional.sources import EventLog
from bench.harness import Harness
from bench.measure import (
    BACKENDS,
    BIG_BATCH_CONF,
    CLUSTER_DAG,
    SCHEMA,
    Report,
    Sizes,
    dirty_result,
    git_commit,
    machine,
)
from bench.sections import (
    cluster,
    commit,
    decisions,
    evolution,
    history,
    kafka,
    latency,
    objects,
    overhead,
    peer,
    pipelining,
    plan,
    scale,
    startup,
    verify,
    waits,
    work,
)

log = logging.getLogger("bench.perf")

SECTIONS = ("commit", "history", "verify", "decisions", "plan", "startup", "work", "evolution", "objects", "kafka",
            "peer", "overhead", "pipelining", "waits", "scale", "cluster", "latency")
#: The sections that need the benchmark's Airflow running.
ON_AIRFLOW = {"peer", "overhead", "pipelining", "waits", "scale", "cluster"}


def run(h: Harness) -> Report:
    """Every chosen section of the run, in order: the store's, then the peer alone, then Airflow's."""
    started = time.monotonic()
    h.memory.start()
    h.write_dags()
    h.stack.base_dir.mkdir(parents=True, exist_ok=True)
    h.stack.pg.start()
    dsn = h.stack.pg.create_database("airflow_txn")
    logs = ["bench_empty", *(f"bench_{kind}{suffix}" for suffix in BACKENDS.values()
                             for kind in ("serial", "pipelined")), *(w["name"] for w in waits.dags()),
            *(scale.topology(i) for i in range(scale.TOPOLOGIES)), CLUSTER_DAG]
    for name in logs:  # the DAGs' logs exist from the start
        el = EventLog(dsn, name)
        el.create(4)
        el.close()
    chosen, sizes, report = set(h.sections), h.sizes, h.report
    local: cluster.Words | None = None  # cluster: the words topology on this Airflow, the baseline
    try:
        for name, on_store in (("commit", commit), ("history", history), ("verify", verify), ("decisions", decisions),
                               ("plan", plan), ("startup", startup)):
            if name in chosen:
                on_store.run(dsn, sizes, report)
        if "work" in chosen:
            work.run(dsn, SCHEMA, h.base / "work", h.batch_files(sizes.work_batch)[0], sizes, report, BIG_BATCH_CONF)
        if "evolution" in chosen:
            evolution.run(dsn, SCHEMA, h.base / "evolution", h.batch_files(sizes.work_batch), sizes, report)
        if "objects" in chosen:
            objects.run(dsn, SCHEMA, h.base / "objects", h.batch_files(sizes.work_batch)[0], sizes, report,
                        BIG_BATCH_CONF)
        if "kafka" in chosen:
            kafka.run(dsn, h, sizes, report)
        peer_results = peer.alone(h) if "peer" in chosen else {}
        if ON_AIRFLOW & chosen:
            h.stack.start()
            h.settle(h.dag_ids())
            if "overhead" in chosen:
                overhead.run(h)
            for backend in BACKENDS:
                if "pipelining" in chosen:
                    pipelining.run(h, backend)
                if "peer" in chosen and backend in sizes.peer_backends:
                    peer.ours(h, peer_results, backend)
            if "waits" in chosen:
                waits.run(h)
            if "scale" in chosen:
                scale.run(h)
            if "cluster" in chosen:
                local = cluster.words_on(h)
        h.memory_rows()
    finally:
        h.memory.stopped.set()
        h.stack.stop(remove=h.throwaway)  # a run in a temporary directory leaves no server data behind
    if local is not None:  # the cluster stack, after this Airflow's end
        cluster.run(h, local)
    if "latency" in chosen:  # a stack of its own (the payments example), after the other's end
        latency.run(h.base / "latency", sizes, report)
    report.wall_seconds = time.monotonic() - started
    return report


def plot(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.rows if r.ratio is not None]
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.5))
    labels = [f"{r.section}: {r.measure}"[:80] for r in rows]
    colours = ["#4c9a2a" if r.met else "#c0392b" if r.met is False else "#7f8c8d" for r in rows]
    ax.barh(range(len(rows)), [r.ratio or 0 for r in rows], color=colours)
    for i, r in enumerate(rows):
        ax.text((r.ratio or 0) + 0.02, i, f"{r.ratio:.2f}x  (target {r.target or '-'})", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio (see the table for which way each is stated)")
    ax.set_title(f"airflow-provider-transactional benchmarks, {report.started[:10]} ({report.machine})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.perf", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes; the whole run takes about 12 minutes")
    parser.add_argument("--only", help=f"comma-separated sections (default all of {', '.join(SECTIONS)})")
    parser.add_argument("--backends", help=f"comma-separated backends the peer section runs ours on (default: "
                        f"{', '.join(Sizes().peer_backends)}; quick: {', '.join(Sizes.quick().peer_backends)})")
    parser.add_argument("--dir", help="where to keep Postgres, Airflow, data and logs (default: a temp dir)")
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--pg-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the embedded Postgres (repeatable), e.g. shared_buffers=4GB")
    parser.add_argument("--plot", default="docs/benchmarks.png", help="the PNG plot (default docs/benchmarks.png)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sections = tuple(args.only.split(",")) if args.only else SECTIONS
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}: choose from {', '.join(SECTIONS)}")
    bad = [x for x in args.pg_setting if "=" not in x]
    if bad:
        parser.error(f"--pg-setting takes NAME=VALUE, got {bad[0]!r} (e.g. --pg-setting shared_buffers=4GB)")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # before the run, not after it
        parser.error("--plot needs matplotlib: pip install -c requirements/constraints.txt -e '.[bench]' (make "
                     "bench does), or pass --plot ''")
    if dirty := dirty_result(args.json):
        parser.error(dirty)
    pg_settings = dict(x.split("=", 1) for x in args.pg_setting)
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.backends:
        sizes.peer_backends = tuple(b.strip() for b in args.backends.split(","))
        if set(sizes.peer_backends) - set(BACKENDS):
            parser.error(f"unknown backends in {args.backends!r}: choose from {', '.join(BACKENDS)}")
    report = Report(started=datetime.now(UTC).isoformat(timespec="seconds"), machine=machine(),
                    quick=args.quick, pg_settings=pg_settings, commit=git_commit(),
                    command=shlex.join(["python", "-m", "bench.perf", *(sys.argv[1:] if argv is None else argv)]))
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="txn-bench-"))
    harness = Harness(base.resolve(), sizes, report, sections, pg_settings)
    harness.throwaway = not args.dir
    run(harness)
    tuned = "".join(f" --pg-setting {k}={v}" for k, v in pg_settings.items())
    print(f"\nbenchmarks, {report.started} ({report.machine}){' --quick' if args.quick else ''}{tuned}, "
          f"{report.wall_seconds / 60:.1f} min\n")
    print(report.table())
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2, default=str))
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(report, Path(args.plot))
        print(f"\nplot: {args.plot}")
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if any("RESULTS DIFFER" in r.note for r in report.rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

