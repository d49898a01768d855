"""What the commands share: how the state store is found, and the arguments several commands take."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

from ..connections import DSN_FILE_ENV, dsn_and_connections, read_dsn_file, redact
from ..coordinator import Coordinator
from ..exceptions import ConfigError

#: A subcommand: the parsed arguments and the store's door in, the exit code out.
Command = Callable[[argparse.Namespace, Coordinator], int]


def given(args: argparse.Namespace) -> tuple[str, dict[str, dict[str, Any]]]:
    """The state store's DSN, and the source connections a DSN file keeps with it."""
    dsn_file = args.dsn_file or os.environ.get(DSN_FILE_ENV)
    if dsn_file:
        return dsn_and_connections(read_dsn_file(dsn_file))
    if args.dsn:
        return str(args.dsn), {}
    if os.environ.get("AIRFLOW_TXN_DSN"):
        return os.environ["AIRFLOW_TXN_DSN"], {}
    try:
        from ..airflow.hooks import TransactionalHook

        return TransactionalHook(args.conn_id).get_dsn(), {}
    except Exception as exc:  # no Airflow configured here, or no such connection
        raise ConfigError(f"no state store given: set AIRFLOW_TXN_DSN (e.g. postgresql://user:password@host:5432/db), "
                          f"pass --dsn-file FILE, or an Airflow connection's --conn-id ({redact(str(exc))})") from None


def txid(text: str) -> int:
    """A txid on the command line: a whole number from 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a txid is a whole number from 1, got {text!r}")
    return int(text)


def txid_or_zero(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"a txid is a whole number, got {text!r}")
    return int(text)


def print_rows(rows: list[tuple[Any, ...]], columns: list[str], as_json: bool) -> None:
    for row in rows:
        if as_json:
            print(json.dumps(dict(zip(columns, row, strict=True)), default=str, sort_keys=True))
        else:
            print("\t".join("" if v is None else str(v) for v in row))


def spark_options(one: argparse.ArgumentParser) -> None:
    """The options of a command that runs the topology's Spark job, and its --json."""
    one.add_argument("--dag-file", help="the DAG file that declares the topology: its Spark job is run from it")
    one.add_argument("--master", default=os.environ.get("AIRFLOW_TXN_SPARK_MASTER", "local[2]"),
                     help="Spark master (default local[2])")
    one.add_argument("--conf", action="append", default=[], help="extra Spark conf key=value")
    one.add_argument("--json", action="store_true")
