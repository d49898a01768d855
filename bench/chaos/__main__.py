"""``python -m bench.chaos``: the soak; ``--quick``: a few transactions and faults; ``--check DIR``: judge a
run whose harness died."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import tempfile
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.measure import dirty_result, git_commit, machine

from .config import (
    BACKENDS,
    CLUSTER_KINDS,
    CONNECT_KINDS,
    KAFKA_KINDS,
    KINDS,
    LEDGER,
    MODES,
    OBJECT_KINDS,
    STACKS,
    ChaosConfig,
    ChaosReport,
)
from .harness import Chaos, chaos_stack, recheck


def build_parser() -> argparse.ArgumentParser:
    """The command's arguments (the docs' test parses the commands the chaos page gives)."""
    parser = argparse.ArgumentParser(prog="python -m bench.chaos",
                                     description="Exactly-once under faults: the chaos harness.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mode", choices=sorted(MODES), default="words",
                        help="words: the words topology against an oracle of its events; payments: both "
                        "stages of the payments example against its invariants (dev/payments.py); kafka: words "
                        "read from a Kafka topic (opaque) against the records its producers committed, with "
                        "the broker's own faults; s3: words read from files landed in an S3 bucket (opaque) against "
                        "every version uploaded, less those overwritten or deleted under a plan, with the store's "
                        "own faults")
    parser.add_argument("--stack", choices=STACKS, default="local",
                        help="local: LocalExecutor and Spark local[N]; cluster: CeleryExecutor (Redis, two "
                        "workers) and a Spark standalone cluster (dev/cluster.py), with the cluster's own faults "
                        f"({', '.join(CLUSTER_KINDS)})")
    parser.add_argument("--backend", choices=BACKENDS, default="spark-submit",
                        help="spark-submit: a driver a batch; connect: batches run on a Spark Connect server (the "
                        "stack's; on a cluster an application of it), with its own fault "
                        f"({', '.join(CONNECT_KINDS)})")
    parser.add_argument("--quick", action="store_true",
                        help="a few minutes: 6 transactions, 5 faults (payments: 3 and 3; kafka and s3: 6 "
                        "and 6; on a cluster 8 and 6: each cluster kind once, and a clear)")
    parser.add_argument("--transactions", type=int, help="transactions to trigger (default 200)")
    parser.add_argument("--faults", type=int, help="faults to inject, balanced across kinds (default 400)")
    parser.add_argument("--kinds", help=f"comma-separated fault kinds (default: all of {', '.join(KINDS)}, and "
                        f"in kafka mode {', '.join(KAFKA_KINDS)}, in s3 mode {', '.join(OBJECT_KINDS)}, "
                        f"on a cluster {', '.join(CLUSTER_KINDS)}; quick: "
                        "the ones that cost no restart)")
    parser.add_argument("--audit", action=argparse.BooleanOptionalAction, default=None,
                        help="run `airflow-txn audit` at the end (default: yes for the soak, no with --quick)")
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                        help="words: each run ends with a round of the shadow audit, and every committed txid must "
                        "end verified (default: yes)")
    parser.add_argument("--dir", help="where to keep Postgres, Airflow, logs and the producers' ledger "
                        "(a new directory; default: a temp dir)")
    parser.add_argument("--check", metavar="DIR", help="only check the state a run left in DIR (its --dir) "
                        "against its ledger: for a run whose harness died")
    parser.add_argument("--json", help="also write the report here")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if dirty := dirty_result(args.json):
        parser.error(dirty)
    started = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "commit": git_commit(), "machine": machine(),
               "command": shlex.join(["python", "-m", "bench.chaos", *(sys.argv[1:] if argv is None else argv)])}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    cfg = (ChaosConfig.quick(args.seed, args.mode, args.stack, args.backend) if args.quick
           else ChaosConfig(seed=args.seed, mode=args.mode, stack=args.stack, backend=args.backend))
    if args.audit is not None:
        cfg.audit = args.audit
    cfg.verify = args.verify
    if args.kinds:
        cfg.kinds = tuple(k for k in args.kinds.split(",") if k)
    cfg.transactions = args.transactions or cfg.transactions
    cfg.faults = args.faults if args.faults is not None else cfg.faults
    if unknown := set(cfg.kinds) - set(cfg.known_kinds):
        parser.error(f"unknown fault kinds {sorted(unknown)} in {cfg.mode} mode on the {cfg.stack} stack: choose "
                     f"from {', '.join(cfg.known_kinds)}")
    if args.check:
        base = Path(args.check).resolve()
        if not (base / LEDGER).exists():
            parser.error(f"{base} holds no {LEDGER}: --check takes the --dir of an earlier run")
        report = recheck(base, cfg)
        print(f"\nchaos --check {base}: the state and the audit log against the ledger "
              "(faults and stuck runs are not known after the fact)\n")
        print(report.table())
        if args.json:
            write_json(Path(args.json), started, report)
        return 1 if report.violations else 0
    base = Path(args.dir or tempfile.mkdtemp(prefix="chaos-")).resolve()
    if base.exists() and any(base.iterdir()):
        parser.error(f"{base} is not empty: give --dir a new directory (or --check {base} to check "
                     "the run it holds)")
    stack = chaos_stack(base, cfg)
    logging.info("chaos: Postgres, Airflow, logs and the producers' ledger in %s (--check %s re-checks it)",
                 base, base)
    try:
        stack.start()
        report = Chaos(stack, cfg).run()
    finally:
        stack.stop()
    print(f"\nchaos ({cfg.mode}): seed {cfg.seed}, {cfg.transactions} transactions, {cfg.faults} faults "
          f"({', '.join(cfg.kinds)}); logs and ledger in {base}\n")
    print(report.table())
    if args.json:
        write_json(Path(args.json), started, report)
    return 1 if report.violations else 0


def write_json(path: Path, started: dict[str, str], report: ChaosReport) -> None:
    """The report as JSON: when, on what commit and machine, by which command; the table's rows as
    printed (what the docs' chaos page renders), and every field of the report."""
    out: dict[str, Any] = {**started, "rows": [[k, str(v)] for k, v in report.rows()],
                           "problems": report.invariant_failures + report.problems, "violations": report.violations,
                           "report": asdict(report)}
    path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
