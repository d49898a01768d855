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
    spark_target(one)
    one.add_argument("--json", action="store_true")


def spark_target(one: argparse.ArgumentParser) -> None:
    """Where a command runs the topology's Spark job: a spark-submit driver on --master, or a
    client of the Spark Connect server of an Airflow connection."""
    one.add_argument("--master", default=os.environ.get("AIRFLOW_TXN_SPARK_MASTER", "local[2]"),
                     help="Spark master of a spark-submit driver (default local[2]; e.g. spark://host:7077)")
    one.add_argument("--conf", action="append", default=[], help="extra Spark conf key=value (spark-submit only)")
    one.add_argument("--spark-connect", metavar="CONN_ID",
                     help="run the job as a client of the Spark Connect server of this Airflow connection (as a "
                          "DAG's spark_connect_conn_id), instead of a spark-submit driver")


def on_spark(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`~airflow_transactional.spark.recompute.recompute`'s arguments of where the job runs."""
    remote = None
    if args.spark_connect:
        if "://" in args.spark_connect:
            raise ConfigError("--spark-connect takes an Airflow connection id, not a URL (a URL's token shows in ps): "
                              "e.g. AIRFLOW_CONN_MY_SPARK='{\"conn_type\": \"spark_connect\", \"host\": \"sc://host\", "
                              "\"port\": 15002, \"password\": \"TOKEN\"}' and --spark-connect my_spark")
        try:
            from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

            remote = SparkConnectHook(args.spark_connect).get_connection_url()
        except Exception as exc:  # no Airflow configured here, or no such connection
            raise ConfigError(f"no Spark Connect server from the Airflow connection {args.spark_connect!r} "
                              f"({redact(str(exc))}): define it (conn_type spark_connect: host, port, the token "
                              "as its password) or drop --spark-connect") from None
    return {"master": args.master, "conf": args.conf, "remote": remote}
