"""``airflow-txn``: inspect and repair topologies from the command line.

The store is found from ``--dsn``, else ``AIRFLOW_TXN_DSN``, else the Airflow connection named
by ``--conn-id`` (default ``transactional_default``) when Airflow is configured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .coordinator import Coordinator, TopologyStatus
from .exceptions import TransactionalError
from .store.connection import redact
from .store.migrations import DEFAULT_SCHEMA


def _dsn(args: argparse.Namespace) -> str:
    if args.dsn:
        return str(args.dsn)
    if os.environ.get("AIRFLOW_TXN_DSN"):
        return os.environ["AIRFLOW_TXN_DSN"]
    raise SystemExit("no state store given: pass --dsn or set AIRFLOW_TXN_DSN "
                     "(e.g. postgresql://user:password@host:5432/db)")


def _print_status(st: TopologyStatus) -> None:
    print(f"topology        {st.topology_id}")
    print(f"committed txid  {st.committed_txid}  (last commit {st.last_commit_at or 'never'})")
    print(f"lag             {st.lag}")
    print(f"quarantined     {st.quarantined} committed, {st.quarantined_pending} pending")
    if st.lost_records:
        print(f"lost to retention {st.lost_records} records (opaque re-plans)")
    print(f"blocked by      {st.blocked_by or '-'}")
    if st.in_flight:
        print("in flight:")
        for f in st.in_flight:
            extra = f"  error: {f.error}" if f.error else ""
            print(f"  txid {f.txid:<6} {f.phase:<10} run {f.run_key}  plan v{f.plan_version}, "
                  f"{f.attempts} attempt(s){extra}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="airflow-txn", description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="state store DSN/URI (default: $AIRFLOW_TXN_DSN)")
    parser.add_argument("--schema", default=DEFAULT_SCHEMA, help="the provider's schema")
    sub = parser.add_subparsers(dest="command", required=True)
    p_status = sub.add_parser("status", help="committed txid, in-flight txids, lag, blockers")
    p_status.add_argument("topology")
    p_status.add_argument("--json", action="store_true")
    p_commits = sub.add_parser("commits", help="the audit log of commits, in txid order")
    p_commits.add_argument("topology")
    p_recover = sub.add_parser("recover", help="discard staged output that can never commit")
    p_recover.add_argument("topology")
    args = parser.parse_args(argv)

    coord = Coordinator(_dsn(args), schema=args.schema)
    try:
        if args.command == "status":
            st = coord.status(args.topology)
            if args.json:
                print(json.dumps(st.to_dict(), indent=2, default=str))
            else:
                _print_status(st)
            return 2 if st.blocked_by else 0
        if args.command == "commits":
            rows: list[dict[str, Any]] = coord.commits(args.topology)
            for r in rows:
                print(json.dumps(r, default=str, sort_keys=True))
            return 0
        if args.command == "recover":
            res = coord.recover(args.topology)
            print(f"discarded {res.attempts_discarded} attempts, {res.staged_rows_deleted} staged rows, "
                  f"{res.quarantine_rows_deleted} quarantine rows")
            return 0
    except TransactionalError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return 1
    finally:
        coord.close()
    return 1


if __name__ == "__main__":
    sys.exit(main())
