"""``airflow-txn`` commands of the delta history (``core/history.py``) -- what a txid changed, a state
as of a txid, the history's snapshot, retention and size --, of the quarantine a replay takes
records from (``core/replays.py``): list them, edit one, or fix many with a Python function -- and
of the shadow audit (``core/verify.py``): a round of it, its statuses, a check run again."""

from __future__ import annotations

import argparse
import importlib
import json
import os
from collections.abc import Callable
from typing import Any

from .airflow.dagfile import declared_as_stored
from .coordinator import Coordinator
from .exceptions import ConfigError, NotYourTurn
from .ranges import Round, txid_range
from .spark.recompute import recompute

Command = Callable[[argparse.Namespace, Coordinator], int]


def _print_rows(rows: list[tuple[Any, ...]], columns: list[str], as_json: bool) -> None:
    for row in rows:
        if as_json:
            print(json.dumps(dict(zip(columns, row, strict=True)), default=str, sort_keys=True))
        else:
            print("\t".join("" if v is None else str(v) for v in row))


def state(args: argparse.Namespace, coord: Coordinator) -> int:
    spec = coord.spec(args.topology)
    rows = coord.state_as_of(args.topology, args.state, args.as_of)
    _print_rows(rows, [*spec.state(args.state).key_columns, "value"], args.json)
    return 0


def changes(args: argparse.Namespace, coord: Coordinator) -> int:
    spec = coord.spec(args.topology)
    if args.state:
        spec.state(args.state)  # a state it does not declare is an error, not an empty answer
    found = coord.changes(args.topology, args.txid)
    for name, rows in found.items():
        if args.state and name != args.state:
            continue
        if not args.json:
            print(f"# state {name}: {len(rows)} keys changed by txid {args.txid}")
        _print_rows(rows, [*spec.state(name).key_columns, "delta"], args.json)
    return 0


def history(args: argparse.Namespace, coord: Coordinator) -> int:
    if args.snapshot and args.keep is not None:
        raise ConfigError("give --snapshot or --keep, not both")
    if args.snapshot:
        print(f"the delta history of {args.topology} now starts at a snapshot as of txid "
              f"{coord.history_snapshot(args.topology)}")
    elif args.keep is not None:
        upto = coord.compact_history(args.topology, args.keep)
        print(f"folded txids through {upto} into the snapshot" if upto is not None else
              f"nothing to fold: the history holds no more than the last {args.keep} txids")
    views = coord.history_views(args.topology)
    for name, size in coord.history_sizes(args.topology).items():
        print(f"state {name}: {size.deltas} deltas, its staging table {size.bytes} bytes; "
              f"in SQL: {views[name]} (txid, keys, delta)")
    return 0


def quarantine(args: argparse.Namespace, coord: Coordinator) -> int:
    if args.edit is not None:
        text = _record_file(args.record_file) if args.record_file else args.record
        if text is None:
            raise ConfigError("--edit ID takes the record's new text: --record TEXT or --record-file FILE")
        coord.edit_quarantined(args.topology, args.edit, text)
        print(f"record {args.edit} of {args.topology}: edited; a replay reads the new text")
        return 0
    rows = coord.quarantined_records(args.topology, txid=args.txid, reason=args.reason)
    if args.fixer:
        return _fix(args, coord, rows)
    for r in rows:
        if args.json:
            print(json.dumps(r, default=str, sort_keys=True))
        else:
            became = (f"counted by txid {r['corrected_by']}" if r["corrected_by"] else
                      f"replayed by txid {r['replayed_by']}" if r["replayed_by"] else
                      "edited" if r["edited_record"] is not None else "waiting")
            print(f"{r['id']}\ttxid {r['txid']}\t{r['source_offset']}\t{became}\t{r['reason']}")
    return 0


def _record_file(path: str) -> str:
    """The text of ``--record-file`` (UTF-8, its last newline dropped), or a ConfigError naming the file."""
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8").rstrip("\n")
    except OSError as exc:
        raise ConfigError(f"--record-file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--record-file {path} is not UTF-8 text (byte {exc.start}): save it as UTF-8") from None


def _fixer(given: str) -> Callable[[str], Any]:
    """The function ``--fixer module:function`` names, or a ConfigError saying what is missing."""
    module, _, name = given.partition(":")
    if not module or not name:
        raise ConfigError(f"--fixer takes module:function (a function of the record's text), got {given!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ConfigError(f"--fixer {given}: no module {module!r} can be imported here ({exc}); put it on "
                          "PYTHONPATH") from None
    except AttributeError:
        raise ConfigError(f"--fixer {given}: module {module!r} has no {name!r}") from None
    if not callable(fn):
        raise ConfigError(f"--fixer {given}: {name!r} is not a function")
    return fn


def _fix(args: argparse.Namespace, coord: Coordinator, rows: list[dict[str, Any]]) -> int:
    """Run ``--fixer module:function`` over the records not yet replayed: its text back is kept as the
    record's edit (None: left as it is). Each edit is its own commit: a fixer that fails on one
    record (or is interrupted) keeps the edits made before it, and the error names the record."""
    fn = _fixer(args.fixer)
    fixed = 0
    for r in rows:
        if r["corrected_by"] or r["replayed_by"]:
            continue
        try:
            text = fn(r["edited_record"] if r["edited_record"] is not None else r["record"])
        except (Exception, KeyboardInterrupt) as exc:
            raise ConfigError(f"--fixer {args.fixer} failed on record {r['id']} ({type(exc).__name__}: {exc}); "
                              f"{fixed} record(s) edited before it are kept") from None
        if text is not None:
            coord.edit_quarantined(args.topology, r["id"], str(text))
            fixed += 1
    print(f"{fixed} of {len(rows)} records edited by {args.fixer}; replay them with a run triggered with the conf "
          f"{{\"replay\": {{...}}}}")
    return 0


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
    result = recompute(coord.dsn, coord.schema, spec, "preview", master=args.master, conf=args.conf,
                       mode_value=f"{first}..{last}")
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
        found = recompute(coord.dsn, coord.schema, spec, "verify", master=args.master, conf=args.conf,
                          mode_value=args.round)
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


def _round(text: str) -> str:
    try:
        return str(Round.parse(text, "--round"))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _txid_or_zero(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"a txid is a whole number, got {text!r}")
    return int(text)


def _spark_options(one: argparse.ArgumentParser) -> None:
    """The options of a command that runs the topology's Spark job, and its --json."""
    one.add_argument("--dag-file", help="the DAG file that declares the topology: its Spark job is run from it")
    one.add_argument("--master", default=os.environ.get("AIRFLOW_TXN_SPARK_MASTER", "local[2]"),
                     help="Spark master (default local[2])")
    one.add_argument("--conf", action="append", default=[], help="extra Spark conf key=value")
    one.add_argument("--json", action="store_true")


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add the history's commands with ``command(name, func, help)`` (the CLI's subparser factory)."""
    one = command("state", state, "a state's rows (keys, value) as of a committed txid, from the delta history")
    one.add_argument("state")
    one.add_argument("--as-of", type=_txid_or_zero, metavar="TXID", help="the txid (default: the committed one)")
    one.add_argument("--json", action="store_true", help="one JSON object per line")
    one = command("changes", changes, "what a committed txid changed: each state's keys and deltas")
    one.add_argument("txid", type=_txid_or_zero)
    one.add_argument("--state", help="only this state")
    one.add_argument("--json", action="store_true", help="one JSON object per line")
    one = command("history", history, "the delta history's size; --snapshot starts it at the state tables as of "
                  "the committed txid, --keep N folds all but the last N txids into that snapshot (retention)")
    one.add_argument("--snapshot", action="store_true")
    one.add_argument("--keep", type=_txid_or_zero, metavar="N")
    one = command("correct", correct, "preview what a correction of committed txids A..B would change (their records "
                  "recomputed by the job of --dag-file, nothing committed; --check: exit 4 if the code they were "
                  "committed with computes other deltas), or --withdraw a correction or replay not yet committed")
    one.add_argument("txids", nargs="?", metavar="A..B")
    _spark_options(one)
    one.add_argument("--check", action="store_true", help="a determinism check: exit 4 when the same code "
                     "computes other deltas, 2 when the code differs from theirs (no check possible), else 0")
    one.add_argument("--withdraw", type=_txid_or_zero, metavar="TXID", help="make a planned correction or replay an "
                     "empty txid that commits nothing")
    one = command("verify", verify, "a round of the shadow audit: the next committed txids recomputed by the job of "
                  "--dag-file and checked against their commits, the verified-through mark moved; --status: what "
                  "the checks found; --recheck A..B: run those checks again")
    one.add_argument("--round", default="10", type=_round, metavar="N[:K]",
                     help="up to N txids recomputed, 1 in K sampled (default 10)")
    one.add_argument("--status", action="store_true", help="what the checks found, running nothing")
    one.add_argument("--recheck", metavar="A..B", help="forget the checks of txids A..B (they run again)")
    _spark_options(one)
    one = command("quarantine", quarantine, "the committed quarantined records (id, txid, offset, what became of "
                  "them, reason); --edit ID gives one the text a replay reads, --fixer module:function many")
    one.add_argument("--txid", type=_txid_or_zero, help="only the records this txid quarantined")
    one.add_argument("--reason", help="only the records set aside for this reason")
    one.add_argument("--json", action="store_true", help="one JSON object per line")
    one.add_argument("--edit", type=_txid_or_zero, metavar="ID", help="the record to edit")
    one.add_argument("--record", help="with --edit: its new text")
    one.add_argument("--record-file", help="with --edit: a file holding its new text")
    one.add_argument("--fixer", metavar="MODULE:FUNCTION", help="edit each record listed (not yet replayed) with "
                     "FUNCTION(text) -> new text, or None to leave it")
