"""The delta history's commands (``core/history.py``): what a txid changed, a state as of a txid,
the history's snapshot, retention and size."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..coordinator import Coordinator
from ..exceptions import ConfigError
from .args import print_rows, txid_or_zero


def state(args: argparse.Namespace, coord: Coordinator) -> int:
    spec = coord.spec(args.topology)
    rows = coord.state_as_of(args.topology, args.state, args.as_of)
    print_rows(rows, [*spec.version_at(args.state, args.as_of).key_columns, "value"], args.json)
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
        print_rows(rows, [*spec.version_at(name, args.txid).key_columns, "delta"], args.json)
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


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add the history's commands with ``command(name, func, help)`` (the CLI's subparser factory)."""
    one = command("state", state, "a state's rows (keys, value) as of a committed txid, from the delta history")
    one.add_argument("state")
    one.add_argument("--as-of", type=txid_or_zero, metavar="TXID", help="the txid (default: the committed one)")
    one.add_argument("--json", action="store_true", help="one JSON object per line")
    one = command("changes", changes, "what a committed txid changed: each state's keys and deltas")
    one.add_argument("txid", type=txid_or_zero)
    one.add_argument("--state", help="only this state")
    one.add_argument("--json", action="store_true", help="one JSON object per line")
    one = command("history", history, "the delta history's size; --snapshot starts it at the state tables as of "
                  "the committed txid, --keep N folds all but the last N txids into that snapshot (retention)")
    one.add_argument("--snapshot", action="store_true")
    one.add_argument("--keep", type=txid_or_zero, metavar="N")
