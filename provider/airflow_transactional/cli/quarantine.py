"""The quarantine a replay takes records from (``core/replays.py``): list its records, edit one, or
fix many with a Python function."""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable
from typing import Any

from ..coordinator import Coordinator
from ..exceptions import ConfigError
from .args import txid_or_zero


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


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``quarantine`` with ``command(name, func, help)`` (the CLI's subparser factory)."""
    one = command("quarantine", quarantine, "the committed quarantined records (id, txid, offset, what became of "
                  "them, reason); --edit ID gives one the text a replay reads, --fixer module:function many")
    one.add_argument("--txid", type=txid_or_zero, help="only the records this txid quarantined")
    one.add_argument("--reason", help="only the records set aside for this reason")
    one.add_argument("--json", action="store_true", help="one JSON object per line")
    one.add_argument("--edit", type=txid_or_zero, metavar="ID", help="the record to edit")
    one.add_argument("--record", help="with --edit: its new text")
    one.add_argument("--record-file", help="with --edit: a file holding its new text")
    one.add_argument("--fixer", metavar="MODULE:FUNCTION", help="edit each record listed (not yet replayed) with "
                     "FUNCTION(text) -> new text, or None to leave it")
