"""``airflow-txn`` commands of the delta history (``core/history.py``) -- what a txid changed, a state
as of a txid, the history's snapshot, retention and size -- and of the quarantine a replay takes
records from (``core/replays.py``): list them, edit one, or fix many with a Python function."""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable
from typing import Any

from .coordinator import Coordinator
from .exceptions import ConfigError

Command = Callable[[argparse.Namespace, Coordinator], int]


def _print_rows(rows: list[tuple[Any, ...]], columns: list[str], as_json: bool) -> None:
    for row in rows:
        if as_json:
            print(json.dumps(dict(zip(columns, row, strict=True)), default=str, sort_keys=True))
        else:
            print("\t".join("" if v is None else str(v) for v in row))


def state(args: argparse.Namespace, coord: Coordinator) -> int:
    spec = coord.spec(args.topology)
    txid = coord.status(args.topology).committed_txid if args.as_of is None else args.as_of
    rows = coord.state_as_of(args.topology, args.state, txid)
    _print_rows(rows, [*spec.state(args.state).key_columns, "value"], args.json)
    return 0


def changes(args: argparse.Namespace, coord: Coordinator) -> int:
    spec = coord.spec(args.topology)
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
    for name, size in coord.history_sizes(args.topology).items():
        print(f"state {name}: {size.deltas} deltas, its staging table {size.bytes} bytes")
    return 0


def quarantine(args: argparse.Namespace, coord: Coordinator) -> int:
    if args.edit is not None:
        text = args.record if args.record is not None else None
        if args.record_file:
            with open(args.record_file, encoding="utf-8") as fh:
                text = fh.read().rstrip("\n")
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


def _fix(args: argparse.Namespace, coord: Coordinator, rows: list[dict[str, Any]]) -> int:
    """Run ``--fixer module:function`` over the records not yet replayed: its text back is kept as the
    record's edit (None: left as it is)."""
    module, _, name = args.fixer.partition(":")
    if not module or not name:
        raise ConfigError(f"--fixer takes module:function (a function of the record's text), got {args.fixer!r}")
    fn = getattr(importlib.import_module(module), name)
    fixed = 0
    for r in rows:
        if r["corrected_by"] or r["replayed_by"]:
            continue
        text = fn(r["edited_record"] if r["edited_record"] is not None else r["record"])
        if text is not None:
            coord.edit_quarantined(args.topology, r["id"], str(text))
            fixed += 1
    print(f"{fixed} of {len(rows)} records edited by {args.fixer}; replay them with a run triggered with the conf "
          f"{{\"replay\": {{...}}}}")
    return 0


def _txid_or_zero(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"a txid is a whole number, got {text!r}")
    return int(text)


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
