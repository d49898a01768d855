"""``airflow-txn`` commands of the delta history (``core/history.py``): what a txid changed, a state
as of a txid, and the history's snapshot, retention and size."""

from __future__ import annotations

import argparse
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
