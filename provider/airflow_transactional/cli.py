"""``airflow-txn``: inspect and repair topologies from the command line.

The store is found from ``--dsn-file`` (or ``$AIRFLOW_TXN_DSN_FILE``), else ``$AIRFLOW_TXN_DSN``,
else the Airflow connection named by ``--conn-id`` (default ``transactional_default``) when
Airflow is configured. ``--dsn`` works too, but a password on the command line shows in ``ps``
and in the shell's history: prefer the others.

One function per subcommand (``set_defaults(func=...)``); each gets the parsed arguments and a
:class:`~airflow_transactional.coordinator.Coordinator` (``spark-cds`` needs no store) and returns
the exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg2

from . import cli_history, provenance
from .airflow.dagfile import declared_as_stored, declared_topologies
from .connections import DSN_FILE_ENV, Connections, dsn_and_connections, read_dsn_file, redact
from .coordinator import Coordinator
from .exceptions import ConfigError, TransactionalError
from .model import DEFAULT_SCHEMA, TopologyStatus, duration
from .sources.eventlog import EventLog
from .spark import cds, jars
from .spark.recompute import recompute

__all__ = ["main"]

Command = Callable[[argparse.Namespace, Coordinator], int]


def _given(args: argparse.Namespace) -> tuple[str, dict[str, dict[str, Any]]]:
    """The state store's DSN, and the source connections a DSN file keeps with it."""
    dsn_file = args.dsn_file or os.environ.get(DSN_FILE_ENV)
    if dsn_file:
        return dsn_and_connections(read_dsn_file(dsn_file))
    if args.dsn:
        return str(args.dsn), {}
    if os.environ.get("AIRFLOW_TXN_DSN"):
        return os.environ["AIRFLOW_TXN_DSN"], {}
    try:
        from .airflow.hooks import TransactionalHook

        return TransactionalHook(args.conn_id).get_dsn(), {}
    except Exception as exc:  # no Airflow configured here, or no such connection
        raise ConfigError(f"no state store given: set AIRFLOW_TXN_DSN (e.g. postgresql://user:password@host:5432/db), "
                          f"pass --dsn-file FILE, or an Airflow connection's --conn-id ({redact(str(exc))})") from None


# -- the subcommands -------------------------------------------------------------------------

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
                             readable=args.readable, apply=not args.print)
    if args.print:
        print("\n".join(f"{stmt};" for stmt in statements))
    else:
        print(f"granted {args.runtime_role}" + (f" and {args.producer_role}" if args.producer_role else ""))
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


def _request_id(text: str) -> str:
    """A request id on the command line: non-empty text."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a request id is non-empty text, got ''")
    return text


def _txid(text: str) -> int:
    """A txid on the command line: a whole number from 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a txid is a whole number from 1, got {text!r}")
    return int(text)


def _committed_records(coord: Coordinator, topology_id: str) -> int:
    """The records the topology's commits read: what a recomputation reads again."""
    return sum(int(c.get("records_read") or 0) for c in coord.commits(topology_id))


def audit(args: argparse.Namespace, coord: Coordinator) -> int:
    spec = declared_as_stored(coord.spec(args.topology), args.dag_file, "audit")
    result = recompute(coord.dsn, coord.schema, spec, "audit", master=args.master, conf=args.conf,
                       records=_committed_records(coord, args.topology))
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    elif not result.get("auditable"):
        print(f"cannot audit {args.topology}: {result.get('reason')}")
    else:
        print(f"audit of {args.topology} at committed txid {result['committed_txid']}: "
              f"{result['differences']} difference(s)")
        if result.get("from_verified_txid") is not None:
            print(f"  txids 1..{result['from_verified_txid']} from their delta history (verified before the source's "
                  "retention removed their input), the later ones recomputed from the source")
        for name, st in result["states"].items():
            print(f"  {name:<24} {st['keys']} keys, {st['differences']} differ")
        print(f"  quarantine               {result['quarantined_committed']} committed, "
              f"{result['quarantined_recomputed']} recomputed")
        for line in result["samples"]:
            print(f"  {line}")
    return 0 if result.get("auditable") and not result.get("differences") else 1


def rebuild(args: argparse.Namespace, coord: Coordinator) -> int:
    if args.abort:
        print(f"rebuild of {args.topology} aborted; its journal was freed" if coord.abort_rebuild(
            args.topology, force=args.force) else f"{args.topology} has no rebuild to abort")
        return 0
    spec = declared_as_stored(coord.spec(args.topology), args.dag_file, "rebuild")
    result = recompute(coord.dsn, coord.schema, spec, "rebuild", master=args.master, conf=args.conf,
                       records=_committed_records(coord, args.topology))
    print(f"rebuilt {args.topology} from its source as of txid {result['rebuilt_at_txid']}, replayed "
          f"{result['journal_txids']} txids committed meanwhile (now at txid {result['caught_up_to_txid']})")
    return 0


def spark_cds(args: argparse.Namespace) -> int:
    """Build the class-data-sharing archive (no state store needed)."""
    if not cds.enabled():
        print(f"{cds.SWITCH_ENV} is off: Spark drivers start without a class-data-sharing archive")
        return 0
    found = None if args.force else cds.current()
    try:
        path = found or cds.build(force=args.force)
    except TransactionalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot write the archive under {cds.cache_dir()} ({exc.strerror}): set "
              f"{cds.DIR_ENV} to a writable directory", file=sys.stderr)
        return 1
    print(f"class-data-sharing archive {'already built' if found else 'built'}: {path}")
    return 0


def fetch_jars(args: argparse.Namespace) -> int:
    """Fetch the jars the Spark jobs of Kafka and S3 topologies need (Spark's Kafka connector,
    Hadoop's s3a), with Maven."""
    for what, connector in (("Spark's Kafka connector", jars.kafka_connector()),
                            ("Hadoop's s3a file system", jars.s3a_connector())):
        found = connector.find()
        fetched = found if found is not None else connector.fetch()
        size = sum(p.stat().st_size for p in fetched) / 2**20
        print(f"{what} {'already fetched' if found is not None else 'fetched'}: {len(fetched)} jars, "
              f"{size:.1f} MiB in {connector.directory}")
    return 0


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


# -- the parser ------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    """The command line: global options, and one subparser per command (its function as ``func``)."""
    p = argparse.ArgumentParser(prog="airflow-txn", description=__doc__.splitlines()[0])
    p.add_argument("--dsn-file", help=f"a file (mode 600) holding the state store's DSN/URI (default: ${DSN_FILE_ENV})")
    p.add_argument("--dsn", help="state store DSN/URI (default: $AIRFLOW_TXN_DSN); shows in ps and shell history: "
                   "prefer $AIRFLOW_TXN_DSN or --dsn-file")
    p.add_argument("--conn-id", default="transactional_default",
                   help="Airflow connection of the store (when --dsn and $AIRFLOW_TXN_DSN are not set)")
    p.add_argument("--schema", default=DEFAULT_SCHEMA, help="the provider's schema")
    sub = p.add_subparsers(dest="command", required=True)
    _operating_commands(sub)
    _spark_commands(sub)
    return p


def _command(sub: Any, name: str, func: Command | Callable[[argparse.Namespace], int], text: str,
             topology: bool = True) -> argparse.ArgumentParser:
    one: argparse.ArgumentParser = sub.add_parser(name, help=text, description=text)
    one.set_defaults(func=func)
    if topology:
        one.add_argument("topology")
    return one


def _operating_commands(sub: Any) -> None:
    """What an operator runs against the state store: status, registration, grants, repairs."""
    _command(sub, "status", status, "committed txid, in-flight txids, lag, blockers").add_argument(
        "--json", action="store_true")
    _command(sub, "commits", commits, "the audit log of commits, in txid order").add_argument(
        "--json", action="store_true", help="one JSON object per line")
    one = _command(sub, "verdict", verdict, "a decision's verdict on requests (granted, declined, or not yet "
                   "decided): what a requester asks")
    one.add_argument("decision")
    one.add_argument("request_ids", nargs="+", metavar="REQUEST_ID", type=_request_id)
    _command(sub, "register", register, "register the topologies that DAG files declare (as the schema's owner: "
             "creates their tables; the run-time role then needs no DDL rights)", topology=False).add_argument(
        "dag_files", nargs="+", metavar="DAG_FILE")
    one = _command(sub, "grant", grant, "grant a run-time role (and a producer role) what they need, no more; run "
                   "as the schema's owner after registering", topology=False)
    one.add_argument("--runtime-role", required=True, help="the role Airflow's tasks connect as")
    one.add_argument("--producer-role", help="a role that may only append to the logs given with --log")
    one.add_argument("--log", action="append", default=[], help="a log the producer role may append to")
    one.add_argument("--readable", action="append", default=[], help="a decision's headroom table they may read")
    one.add_argument("--print", action="store_true", help="print the SQL instead of running it")
    _command(sub, "reset", reset, "forget a topology's progress and drop its state tables: its next run starts "
             "over from the beginning of its source (after a changed declaration)").add_argument(
        "--yes", action="store_true", help="really do it (pause the DAG first)")
    _command(sub, "recover", recover, "discard staged output that can never commit")
    cli_history.add_commands(lambda name, func, text: _command(sub, name, func, text))
    one = _command(sub, "publish", publish, "publish the committed txids not yet published of the outputs declared "
                   "with a Kafka topic (what the DAG's publish task does), or --mark-published")
    one.add_argument("--through", type=_txid, help="publish no further than this txid")
    one.add_argument("--mark-published", type=_txid, metavar="TXID", help="record the txids through TXID as "
                     "published without sending them (after you published them yourself)")
    one.add_argument("--output", help="with --mark-published: only this output (default: every published one)")
    one = _command(sub, "repair-log", repair_log, "move an event log's counter (its next LSN) back to just past what "
                   "it holds and what its readers planned, after it was set too far (as the schema's owner)",
                   topology=False)
    one.add_argument("log")
    one.add_argument("--partition", type=int, help="only this partition (default: every one)")


def repair_log(args: argparse.Namespace, _coord: Coordinator) -> int:
    elog = EventLog(_given(args)[0], args.log, schema=args.schema)
    try:
        for p in [args.partition] if args.partition is not None else range(elog.partitions()):
            done = elog.repair(p)
            held = f" (planned that far by {', '.join(done.held_by)}: reset them to go lower)" if done.held_by else ""
            print(f"log {args.log} partition {p}: next LSN {done.before}" +
                  (f" -> {done.after}{held}" if done.after != done.before else f", as it should be{held}"))
    finally:
        elog.close()
    return 0


def _spark_commands(sub: Any) -> None:
    """What runs Spark: audit and rebuild, and the per-machine set-up of Spark."""
    master = os.environ.get("AIRFLOW_TXN_SPARK_MASTER", "local[2]")
    for name, func, text in (("audit", audit, "recompute the state from the source in one Spark pass and diff it"),
                             ("rebuild", rebuild, "recompute the state from the source and swap it in, live")):
        one = _command(sub, name, func, text)
        one.add_argument("--dag-file", help="the DAG file that declares the topology: its Spark job is run from it "
                         "(a store whose declaration differs is refused)" +
                         (" (not needed with --abort)" if name == "rebuild" else ""))
        one.add_argument("--master", default=master, help="Spark master (default local[2]; e.g. spark://host:7077)")
        one.add_argument("--conf", action="append", default=[], help="extra Spark conf key=value")
    audit_parser = sub.choices["audit"]
    audit_parser.add_argument("--json", action="store_true")
    rebuild_parser = sub.choices["rebuild"]
    rebuild_parser.add_argument("--abort", action="store_true", help="forget a rebuild that died half-way")
    rebuild_parser.add_argument("--force", action="store_true", help="with --abort: abort a rebuild still running")
    _command(sub, "spark-cds", spark_cds, "build the class-data-sharing archive that saves a small batch's "
             "spark-submit about a fifth of its CPU and time (once per machine; needs no state store)",
             topology=False).add_argument("--force", action="store_true",
                                          help="build it again even if a verified one exists")
    _command(sub, "fetch-jars", fetch_jars, "fetch Spark's Kafka connector and Hadoop's s3a for the installed Spark "
             "with Maven (once per machine; needs no state store)", topology=False)


#: Commands that need no state store.
NO_STORE = (spark_cds, fetch_jars)


def main(argv: list[str] | None = None) -> int:
    """``airflow-txn``: one line on stderr for any error (never a traceback), exit 1."""
    try:
        args = parser().parse_args(argv)
        if args.func in NO_STORE:
            return int(args.func(args))
        if args.command == "reset" and not args.yes:
            raise ConfigError(f"reset drops the state tables of {args.topology} and its progress: pause its DAG, "
                              f"then run 'airflow-txn reset {args.topology} --yes'")
        dsn, known = _given(args)  # a DSN file's source connections are the store's to resolve
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


if __name__ == "__main__":
    sys.exit(main())
