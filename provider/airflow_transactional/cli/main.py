"""The command line: global options, one subparser per command, and the one place errors become a
line on stderr and an exit code."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any

import psycopg2

from ..connections import DSN_FILE_ENV, Connections, redact
from ..coordinator import Coordinator
from ..exceptions import ConfigError, TransactionalError
from ..model import DEFAULT_SCHEMA
from . import corrections, history, operating, quarantine, spark
from .args import Command, given


def parser() -> argparse.ArgumentParser:
    """The command line: global options, and one subparser per command (its function as ``func``)."""
    first_line = (sys.modules[__package__].__doc__ or "").splitlines()[0]  # the package's docstring says it
    p = argparse.ArgumentParser(prog="airflow-txn", description=first_line)
    p.add_argument("--dsn-file", help=f"a file (mode 600) holding the state store's DSN/URI (default: ${DSN_FILE_ENV})")
    p.add_argument("--dsn", help="state store DSN/URI (default: $AIRFLOW_TXN_DSN); shows in ps and shell history: "
                   "prefer $AIRFLOW_TXN_DSN or --dsn-file")
    p.add_argument("--conn-id", default="transactional_default",
                   help="Airflow connection of the store (when --dsn and $AIRFLOW_TXN_DSN are not set)")
    p.add_argument("--schema", default=DEFAULT_SCHEMA, help="the provider's schema")
    command = functools.partial(_command, p.add_subparsers(dest="command", required=True))
    for group in (operating.add_commands, history.add_commands, corrections.add_commands, quarantine.add_commands,
                  operating.add_log_commands, spark.add_commands):
        group(command)
    return p


def _command(sub: Any, name: str, func: Command | Any, text: str, topology: bool = True) -> argparse.ArgumentParser:
    one: argparse.ArgumentParser = sub.add_parser(name, help=text, description=text)
    one.set_defaults(func=func)
    if topology:
        one.add_argument("topology")
    return one


def main(argv: list[str] | None = None) -> int:
    """``airflow-txn``: one line on stderr for any error (never a traceback), exit 1."""
    try:
        args = parser().parse_args(argv)
        if args.func in spark.NO_STORE:
            return int(args.func(args))
        if args.command == "reset" and not args.yes:
            raise ConfigError(f"reset drops the state tables of {args.topology} and its progress: pause its DAG, "
                              f"then run 'airflow-txn reset {args.topology} --yes'")
        dsn, known = given(args)  # a DSN file's source connections are the store's to resolve
        with Coordinator(dsn, schema=args.schema, connections=Connections(known=known) if known else None) as coord:
            return int(args.func(args, coord))
    except KeyboardInterrupt:
        return print("error: interrupted; what finished before it stays", file=sys.stderr) or 130
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (TransactionalError, psycopg2.Error) as exc:
        print(f"error: {redact(str(exc)).strip()}", file=sys.stderr)
        return 1
    except Exception as exc:
        kafka = sys.modules.get("confluent_kafka")  # loaded only by a command that spoke to Kafka
        if kafka is None or not isinstance(exc, kafka.KafkaException):
            raise
        print(f"error: Kafka: {redact(str(exc)).strip()}: check the Kafka connection's settings and that its "
              "cluster is up", file=sys.stderr)
        return 1
