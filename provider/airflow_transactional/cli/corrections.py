"""Recomputing committed txids with the topology's own job, to act on what it finds: a correction's
preview (``core/corrections.py``) and a round of the shadow audit (``core/verify.py``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from ..airflow.dagfile import declared_as_stored
from ..coordinator import Coordinator, CorrectionPreview, VerificationRound
from ..exceptions import ConfigError, NotYourTurn
from ..ranges import Round, txid_range
from ..spark.recompute import recompute
from .args import on_spark, spark_options, txid_or_zero


def correct(args: argparse.Namespace, coord: Coordinator) -> int:
    """A correction's preview (and determinism check), or a correction withdrawn."""
    if args.withdraw is not None:
        txn = coord.withdraw_correction(args.topology, args.withdraw)
        print(f"txid {txn.txid} of {args.topology} withdrawn: it commits nothing"
              + _committed_now(coord, args.topology, txn.txid))
        return 0
    if not args.txids:
        raise ConfigError("name the committed txids to preview (A..B), or --withdraw TXID")
    first, last = txid_range(args.txids)
    spec = declared_as_stored(coord.spec(args.topology), args.dag_file, "correct")
    result = recompute(coord.dsn, coord.schema, spec, CorrectionPreview(args.topology, first, last), **on_spark(args))
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        _print_preview(result, spec.dag)
    if args.check:
        return 4 if result["nondeterministic"] else 0 if result["same_code"] else 2
    return 0


def _committed_now(coord: Coordinator, topology_id: str, txid: int) -> str:
    """Commit a withdrawn txid now if its turn has come (else its run's commit task, once cleared, does)."""
    try:
        return f"; {coord.commit(topology_id, txid).message}"
    except NotYourTurn:
        return f"; it commits after txid {txid - 1} (clear its run's tasks, or let its commit task retry)"


def _print_preview(result: dict[str, Any], dag_id: str) -> None:
    first, last = result["txids"]
    print(f"a correction of txids {first}..{last} of {result['topology']} would change {result['changed']} keys")
    for name, st in result["states"].items():
        print(f"  {name:<24} {st['changed']} keys, total {st['old_total']} -> {st['new_total']}")
        for key, old, new in st["samples"]:
            print(f"    {key}: {old} -> {new}")
    for name, ev in result.get("outputs", {}).items():
        print(f"  output {name:<17} {ev['retracted']} events retracted, {ev['versions']} new versions, "
              f"{ev['new']} new events")
    if result["nondeterministic"]:
        print("under the very code they were committed with: the job is NOT deterministic (see the keys and events "
              "above)")
    elif result["same_code"]:
        print("under the very code they were committed with: the same deltas (the job is deterministic here)")
    else:
        print(f"to commit it: trigger a run of {dag_id} with the conf {{\"correct\": \"{first}..{last}\"}}")


def verify(args: argparse.Namespace, coord: Coordinator) -> int:
    """A round of the shadow audit by the topology's Spark job (or, with --status, what the checks
    found so far; with --recheck A..B, those checks forgotten to run again). Exit 1 when a check failed."""
    if args.recheck:
        first, last = txid_range(args.recheck)
        print(f"the checks of txids {first}..{last} of {args.topology} will run again; verified through txid "
              f"{coord.verify_recheck(args.topology, first, last)} now")
        return 0
    found: dict[str, Any] = {}
    if not args.status:
        spec = declared_as_stored(coord.spec(args.topology), args.dag_file, "verify")
        found = recompute(coord.dsn, coord.schema, spec, VerificationRound(args.topology, *args.round),
                          **on_spark(args))
    status = coord.verify_status(args.topology)
    if args.json:
        print(json.dumps({**status, "round": found or None}, indent=2, default=str))
    else:
        _print_verification(status, found)
    failed = [c for c in found.get("checked", []) if c["status"] == "failed"]
    failed += [t for t, s in found.get("settled", {}).items() if s == "failed"]
    return 1 if failed or (args.status and status["counts"].get("failed")) else 0


def _print_verification(status: dict[str, Any], found: dict[str, Any]) -> None:
    counts = ", ".join(f"{s} {n}" for s, n in sorted(status["counts"].items()))
    print(f"topology {status['topology']}: verified through txid {status['verified_through']} of "
          f"{status['committed_txid']} committed ({counts or 'nothing committed'})")
    if found.get("busy"):
        print("another round of this topology was running: this one checked nothing")
    elif found:
        settled = ", ".join(f"{t} {s}" for t, s in sorted(found["settled"].items(), key=lambda i: int(i[0])))
        print(f"this round: {len(found['checked'])} txids recomputed" + (f"; settled without: {settled}" if settled
                                                                          else ""))
    for check in status["checks"]:
        if check["status"] in ("verified", "skipped"):
            continue
        detail = check["detail"]
        why = detail.get("reason") or ("differs: " + ", ".join(sorted(detail.get("differences", {}))) if
                                       detail.get("differences") else "")
        print(f"  txid {check['txid']:<8} {check['status']:<13} {why}")
        for name, diff in {**detail.get("differences", {}), **detail.get("states", {})}.items():
            for sample in (diff.get("samples") or [])[:5] if isinstance(diff, dict) else []:
                print(f"    {name}[{sample['key']}]: " + ", ".join(f"{k} {v}" for k, v in sample.items() if k != "key"))


def _round(text: str) -> Round:
    try:
        return Round.parse(text, "--round")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``correct`` and ``verify`` with ``command(name, func, help)`` (the CLI's subparser factory)."""
    one = command("correct", correct, "preview what a correction of committed txids A..B would change (their records "
                  "recomputed by the job of --dag-file, nothing committed; --check: exit 4 if the code they were "
                  "committed with computes other deltas), or --withdraw a correction or replay not yet committed")
    one.add_argument("txids", nargs="?", metavar="A..B")
    spark_options(one)
    one.add_argument("--check", action="store_true", help="a determinism check: exit 4 when the same code "
                     "computes other deltas, 2 when the code differs from theirs (no check possible), else 0")
    one.add_argument("--withdraw", type=txid_or_zero, metavar="TXID", help="make a planned correction or replay an "
                     "empty txid that commits nothing")
    one = command("verify", verify, "a round of the shadow audit: the next committed txids recomputed by the job of "
                  "--dag-file and checked against their commits, the verified-through mark moved; --status: what "
                  "the checks found; --recheck A..B: run those checks again")
    one.add_argument("--round", default="10", type=_round, metavar="N[:K]",
                     help="up to N txids recomputed, 1 in K sampled (default 10)")
    one.add_argument("--status", action="store_true", help="what the checks found, running nothing")
    one.add_argument("--recheck", metavar="A..B", help="forget the checks of txids A..B (they run again)")
    spark_options(one)
