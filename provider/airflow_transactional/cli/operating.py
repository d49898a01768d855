"""What an operator runs against the state store: status, the commits' log, verdicts, registration,
grants, a reset, recovery, publishing to Kafka, a log's counter repaired."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .. import provenance
from ..airflow.dagfile import declared_topologies
from ..coordinator import Coordinator
from ..model import TopologyStatus, duration
from ..sources.eventlog import EventLog
from .args import given, txid


def status(args: argparse.Namespace, coord: Coordinator) -> int:
    st = coord.status(args.topology)
    if args.json:
        print(json.dumps(st.to_dict(), indent=2, default=str))
    else:
        _print_status(st)
    return 2 if st.blocked_by else 0


def commits(args: argparse.Namespace, coord: Coordinator) -> int:
    rows = coord.commits(args.topology)
    if args.json:
        for r in rows:
            print(json.dumps(r, default=str, sort_keys=True))
    else:
        _print_commits(rows)
    return 0


def verdict(args: argparse.Namespace, coord: Coordinator) -> int:
    found = coord.verdicts(args.topology, args.decision, args.request_ids)
    for rid in args.request_ids:
        v = found.get(rid)
        print(f"{rid}: " + ("not decided yet" if v is None else
                            f"{'granted' if v['granted'] else 'declined'} in txid {v['txid']} "
                            f"(amount {v['amount']}, balance after {v['balance_after']})"))
    return 0 if len(found) == len(set(args.request_ids)) else 4


def register(args: argparse.Namespace, coord: Coordinator) -> int:
    for spec in declared_topologies(args.dag_files):
        coord.register(spec)
        print(f"registered {spec.topology_id}")
    return 0


def grant(args: argparse.Namespace, coord: Coordinator) -> int:
    statements = coord.grant(runtime_role=args.runtime_role, producer_role=args.producer_role, logs=args.log,
                             readable=args.readable, auditor_role=args.auditor_role, apply=not args.print)
    if args.print:
        print("\n".join(f"{stmt};" for stmt in statements))
    else:
        print("granted " + " and ".join(r for r in (args.runtime_role, args.producer_role, args.auditor_role) if r))
    return 0


def reset(args: argparse.Namespace, coord: Coordinator) -> int:
    done = coord.reset(args.topology)
    print(f"reset {args.topology}: its next run starts from the beginning of its source; dropped "
          f"{', '.join(done.dropped) or 'no tables'}")
    if done.kept:
        print(f"kept {', '.join(done.kept)}: not made by the topology's registration (drop it yourself if you mean to)")
    return 0


def recover(args: argparse.Namespace, coord: Coordinator) -> int:
    res = coord.recover(args.topology)
    print(f"discarded {res.attempts_discarded} attempts, {res.staged_rows_deleted} staged rows, "
          f"{res.quarantine_rows_deleted} quarantine rows")
    return 0


def publish(args: argparse.Namespace, coord: Coordinator) -> int:
    if args.mark_published is not None:
        outputs = [args.output] if args.output else [o.name for o in coord.spec(args.topology).outputs if o.kafka_topic]
        for output in outputs:
            before = coord.mark_published(args.topology, output, args.mark_published)
            print(f"{args.topology} output {output}: marked published through txid {args.mark_published} "
                  f"(was {before}); nothing was sent to Kafka")
        return 0
    if not any(o.kafka_topic for o in coord.spec(args.topology).outputs):
        print(f"topology {args.topology} publishes nothing to Kafka: none of its outputs is declared with "
              "kafka_topic=...", file=sys.stderr)
        return 2
    for done in coord.publish(args.topology, args.through):
        sent = f"txids {done.txids[0]}..{done.txids[-1]}" if done.txids else "nothing new"
        print(f"{args.topology} output {done.output} -> Kafka topic {done.topic}: published {sent}"
              + (f"; {done.ignored} records in the topic claimed to be this output's and were not believed (see the "
                 "log: someone else writes to the topic?)" if done.ignored else ""))
    return 0


def repair_log(args: argparse.Namespace, _coord: Coordinator) -> int:
    elog = EventLog(given(args)[0], args.log, schema=args.schema)
    try:
        for p in [args.partition] if args.partition is not None else range(elog.partitions()):
            done = elog.repair(p)
            held = f" (planned that far by {', '.join(done.held_by)}: reset them to go lower)" if done.held_by else ""
            print(f"log {args.log} partition {p}: next LSN {done.before}" +
                  (f" -> {done.after}{held}" if done.after != done.before else f", as it should be{held}"))
    finally:
        elog.close()
    return 0


def _request_id(text: str) -> str:
    """A request id on the command line: non-empty text."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a request id is non-empty text, got ''")
    return text


def _print_status(st: TopologyStatus) -> None:
    print(f"topology        {st.topology_id}")
    print(f"committed txid  {st.committed_txid}  (last commit {st.last_commit_at or 'never'})")
    waited = f" (the oldest waiting {st.lag_seconds:.1f} s)" if st.lag and st.lag_seconds is not None else ""
    size = f", {st.lag_bytes:,} bytes" if st.lag_bytes is not None else ""
    print(f"lag             {st.lag} {st.lag_unit}{size}{waited}" if st.source_error is None
          else f"lag             unknown: {st.source_error}")
    print(f"quarantined     {st.quarantined} committed, {st.quarantined_pending} pending"
          + (f"\n  warning       {st.quarantine_warning}" if st.quarantine_warning else ""))
    if st.lost_records:
        print(f"lost to retention {st.lost_records} records (opaque re-plans)")
    if st.lag_unit == "offsets":
        print(f"skipped         {st.offsets_skipped} offsets that held no committed record (aborted "
              "transactions' records, transaction markers)")
    print(f"blocked by      {st.blocked_by or '-'}")
    if st.evolving:
        print(f"evolving        {st.evolving}")
    if st.in_flight:
        print("in flight:")
        now = datetime.now(UTC)
        for f in st.in_flight:
            extra = f"  error: {f.error}" if f.error else ""
            tries = f", {f.failed_tries} failed tries" if f.failed_tries else ""
            lasted = f" for {duration((now - f.since).total_seconds())}" if f.since else ""
            print(f"  txid {f.txid:<6} {f.phase}{lasted}  run {f.run_key}  plan v{f.plan_version}, "
                  f"{f.attempts} attempt(s){tries}{extra}")


def _print_commits(rows: list[dict[str, Any]]) -> None:
    print(f"{'txid':>6}  {'attempt':>7}  {'records':>9}  {'quarantined':>11}  {'committed at':<26}  "
          "deltas per state (rows:hash); code")
    for r in rows:
        digests = ", ".join(f"{k} {v}" for k, v in sorted((r.get("digests") or {}).items())) or "-"
        print(f"{r['txid']:>6}  {r['attempt'] or '-':>7}  {r['records_read']:>9}  {r['quarantined']:>11}  "
              f"{r['committed_at'].isoformat(timespec='seconds'):<26}  {digests}; {provenance.short(r.get('code'))}")


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Status, the commits' log, verdicts, registration, grants, a reset and recovery, with
    ``command(name, func, help, topology=True)`` (the CLI's subparser factory)."""
    command("status", status, "committed txid, in-flight txids, lag, blockers").add_argument(
        "--json", action="store_true")
    command("commits", commits, "the audit log of commits, in txid order").add_argument(
        "--json", action="store_true", help="one JSON object per line")
    one = command("verdict", verdict, "a decision's verdict on requests (granted, declined, or not yet "
                  "decided): what a requester asks")
    one.add_argument("decision")
    one.add_argument("request_ids", nargs="+", metavar="REQUEST_ID", type=_request_id)
    command("register", register, "register the topologies that DAG files declare (as the schema's owner: "
            "creates their tables; the run-time role then needs no DDL rights)", topology=False).add_argument(
        "dag_files", nargs="+", metavar="DAG_FILE")
    one = command("grant", grant, "grant a run-time role (and a producer role) what they need, no more; run "
                  "as the schema's owner after registering", topology=False)
    one.add_argument("--runtime-role", required=True, help="the role Airflow's tasks connect as")
    one.add_argument("--producer-role", help="a role that may only append to the logs given with --log")
    one.add_argument("--log", action="append", default=[], help="a log the producer role may append to")
    one.add_argument("--readable", action="append", default=[], help="a decision's headroom table they may read")
    one.add_argument("--auditor-role", help="the role the verify tasks connect as (verify_conn_id): it alone then "
                     "writes the shadow audit's verdicts and mark, not the run-time role")
    one.add_argument("--print", action="store_true", help="print the SQL instead of running it")
    command("reset", reset, "forget a topology's progress and drop its state tables: its next run starts "
            "over from the beginning of its source (after a changed declaration)").add_argument(
        "--yes", action="store_true", help="really do it (pause the DAG first)")
    command("recover", recover, "discard staged output that can never commit")


def add_log_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Publishing to Kafka, and a log's counter repaired."""
    one = command("publish", publish, "publish the committed txids not yet published of the outputs declared "
                  "with a Kafka topic (what the DAG's publish task does), or --mark-published")
    one.add_argument("--through", type=txid, help="publish no further than this txid")
    one.add_argument("--mark-published", type=txid, metavar="TXID", help="record the txids through TXID as "
                     "published without sending them (after you published them yourself)")
    one.add_argument("--output", help="with --mark-published: only this output (default: every published one)")
    one = command("repair-log", repair_log, "move an event log's counter (its next LSN) back to just past what "
                  "it holds and what its readers planned, after it was set too far (as the schema's owner)",
                  topology=False)
    one.add_argument("log")
    one.add_argument("--partition", type=int, help="only this partition (default: every one)")
