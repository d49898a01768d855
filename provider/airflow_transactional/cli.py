"""``airflow-txn``: inspect and repair topologies from the command line.

The store is found from ``--dsn-file`` (or ``$AIRFLOW_TXN_DSN_FILE``), else ``$AIRFLOW_TXN_DSN``,
else the Airflow connection named by ``--conn-id`` (default ``transactional_default``) when
Airflow is configured. ``--dsn`` works too, but a password on the command line shows in ``ps``
and in the shell's history: prefer the others.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import tempfile
from typing import Any

import psycopg2

from . import rebuild, spark_cds
from .coordinator import Coordinator, TopologyStatus
from .exceptions import ConfigError, TransactionalError
from .spec import TopologySpec
from .store.connection import redact
from .store.migrations import DEFAULT_SCHEMA
from .submit import (
    DSN_FILE_ENV,
    deliver_dsn,
    provider_zip,
    read_dsn_file,
    spark_submit,
    spark_submit_argv,
    with_quiet_driver_logs,
)

# spark_submit and spark_submit_argv moved to .submit; importing them from here still works.
__all__ = ["main", "spark_submit", "spark_submit_argv"]


def _dsn(args: argparse.Namespace) -> str:
    dsn_file = args.dsn_file or os.environ.get(DSN_FILE_ENV)
    if dsn_file:
        return read_dsn_file(dsn_file)
    if args.dsn:
        return str(args.dsn)
    if os.environ.get("AIRFLOW_TXN_DSN"):
        return os.environ["AIRFLOW_TXN_DSN"]
    try:
        from .hooks import TransactionalHook

        return TransactionalHook(args.conn_id).get_dsn()
    except Exception as exc:  # no Airflow configured here, or no such connection
        raise ConfigError(
            f"no state store given: set AIRFLOW_TXN_DSN (e.g. postgresql://user:password@host:5432/db), "
            f"pass --dsn-file FILE, or name an Airflow connection with --conn-id ({redact(str(exc))})") from None


def declared_here(coord: Coordinator, topology_id: str, dag_file: str | None, command: str) -> TopologySpec:
    """The declaration of ``topology_id`` in ``dag_file``, once it is the one the store holds.

    What an owner's command runs (the Spark job of ``audit`` and ``rebuild``) comes from the DAG
    file the owner names, never from the store, which another role may reach; a stored
    declaration that differs is refused, naming the way to make them agree."""
    if not dag_file:
        raise ConfigError(f"{command} runs the topology's Spark job as you: name the DAG file that declares it "
                          f"(airflow-txn {command} {topology_id} --dag-file dags/{topology_id}.py); the job is taken "
                          "from that file, never from the state store")
    found = [spec for spec in declared_topologies([dag_file]) if spec.topology_id == topology_id]
    if not found:
        raise ConfigError(f"{dag_file} does not declare topology {topology_id!r}")
    stored = coord.spec(topology_id).to_config()
    if stored != found[0].to_config():
        changed = sorted(k for k in set(stored) | set(found[0].to_config())
                         if stored.get(k) != found[0].to_config().get(k))
        raise ConfigError(f"the state store's declaration of {topology_id!r} differs from {dag_file}'s "
                          f"({', '.join(changed)}): refusing to {command} with either. Register the file as the "
                          f"schema's owner ('airflow-txn register {dag_file}'), or name the file that was registered")
    return found[0]


def run_job(coord: Coordinator, spec: TopologySpec, mode: str, *, master: str, conf: list[str]) -> dict[str, Any]:
    """Run the topology's own Spark job in ``audit`` or ``rebuild`` mode; return its summary."""
    topology_id = spec.topology_id
    spark = spec.extra.get("spark") or {}
    application = spark.get("application")
    if not application:
        raise TransactionalError(f"topology {topology_id!r} has no Spark application recorded (it was not "
                                 "declared with transactional_dag): nothing to recompute it with")
    bad = [c for c in conf if "=" not in c]
    if bad:
        raise TransactionalError(f"--conf takes key=value, got {bad[0]!r} (e.g. --conf spark.executor.memory=4g)")
    with tempfile.TemporaryDirectory(prefix=f"txn-{mode}-") as tmp:
        result_file = os.path.join(tmp, "result.json")
        settings = with_quiet_driver_logs({"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "8",
                                           **dict(c.split("=", 1) for c in conf)})
        settings = spark_cds.with_archive(settings, spark_cds.current())
        delivery = deliver_dsn(coord.db.dsn, master, None)  # a driver here: a private file, never argv
        argv = spark_submit_argv(master, settings)
        argv += ["--py-files", provider_zip(), application, *spark.get("application_args", []),
                 "--topology", topology_id, "--schema", coord.schema, f"--{mode}", "--result-file", result_file,
                 *delivery.app_args]
        env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        env.pop("AIRFLOW_TXN_DSN", None)
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        finally:
            delivery.remove()
        if not os.path.exists(result_file):
            raise TransactionalError(f"the {mode} job failed ({proc.returncode}):\n{redact(proc.stderr[-4000:])}")
        with open(result_file, encoding="utf-8") as fh:
            return dict(json.load(fh))


def declared_topologies(dag_files: list[str]) -> list[TopologySpec]:
    """The topologies the DAG files declare (each file is run as the dag-processor would: parse only)."""
    specs = []
    for path in dag_files:
        if not os.path.isfile(path):
            raise ConfigError(f"no DAG file {path}")
        found = [task.topology for value in _load_dag_file(path).values()
                 for task in getattr(value, "tasks", []) if isinstance(getattr(task, "topology", None), dict)
                 and task.task_id == "plan"]
        if not found:
            raise ConfigError(f"{path} declares no transactional topology (no transactional_dag in it)")
        specs += [TopologySpec.from_config(config) for config in found]
    return specs


def _load_dag_file(path: str) -> dict[str, Any]:
    """The globals of a DAG file run as the dag-processor would, or a ConfigError saying why it did not load."""
    try:
        return runpy.run_path(path)
    except SyntaxError as exc:
        raise ConfigError(f"{path} does not parse: {exc.msg} (line {exc.lineno}): fix the file") from None
    except SystemExit as exc:
        raise ConfigError(f"{path} exited while loading (SystemExit {exc.code!r}): a DAG file must only declare "
                          "its DAGs") from None
    except TransactionalError:
        raise
    except Exception as exc:
        raise ConfigError(f"{path} failed to load: {type(exc).__name__}: {redact(str(exc)).strip()[:500]}") from None


def build_startup_archive(*, force: bool) -> int:
    if not spark_cds.enabled():
        print(f"{spark_cds.SWITCH_ENV} is off: Spark drivers start without a class-data-sharing archive")
        return 0
    found = None if force else spark_cds.current()
    try:
        path = found or spark_cds.build(force=force)
    except TransactionalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot write the archive under {spark_cds.cache_dir()} ({exc.strerror}): set "
              f"{spark_cds.DIR_ENV} to a writable directory", file=sys.stderr)
        return 1
    print(f"class-data-sharing archive {'already built' if found else 'built'}: {path}")
    return 0


def _print_status(st: TopologyStatus) -> None:
    print(f"topology        {st.topology_id}")
    print(f"committed txid  {st.committed_txid}  (last commit {st.last_commit_at or 'never'})")
    waited = f" (the oldest waiting {st.lag_seconds:.1f} s)" if st.lag and st.lag_seconds is not None else ""
    print(f"lag             {st.lag}{waited}")
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


def _print_commits(rows: list[dict[str, Any]]) -> None:
    print(f"{'txid':>6}  {'attempt':>7}  {'records':>9}  {'quarantined':>11}  {'committed at':<32}  "
          "rows staged per state")
    for r in rows:
        staged = ", ".join(f"{k} {v}" for k, v in sorted((r.get("row_counts") or {}).items())) or "-"
        print(f"{r['txid']:>6}  {r['attempt'] or '-':>7}  {r['records_read']:>9}  {r['quarantined']:>11}  "
              f"{r['committed_at'].isoformat(timespec='seconds'):<32}  {staged}")


def main(argv: list[str] | None = None) -> int:
    """``airflow-txn``: one line on stderr for any error (never a traceback), exit 1."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (TransactionalError, psycopg2.Error) as exc:
        print(f"error: {redact(str(exc)).strip()}", file=sys.stderr)
        return 1


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="airflow-txn", description=__doc__.splitlines()[0])
    parser.add_argument("--dsn-file", help=f"a file (mode 600) holding the state store's DSN/URI (default: "
                        f"${DSN_FILE_ENV})")
    parser.add_argument("--dsn", help="state store DSN/URI (default: $AIRFLOW_TXN_DSN); shows in ps and shell "
                        "history: prefer $AIRFLOW_TXN_DSN or --dsn-file")
    parser.add_argument("--conn-id", default="transactional_default",
                        help="Airflow connection of the store (when --dsn and $AIRFLOW_TXN_DSN are not set)")
    parser.add_argument("--schema", default=DEFAULT_SCHEMA, help="the provider's schema")
    sub = parser.add_subparsers(dest="command", required=True)
    p_status = sub.add_parser("status", help="committed txid, in-flight txids, lag, blockers")
    p_status.add_argument("topology")
    p_status.add_argument("--json", action="store_true")
    p_commits = sub.add_parser("commits", help="the audit log of commits, in txid order")
    p_commits.add_argument("topology")
    p_commits.add_argument("--json", action="store_true", help="one JSON object per line")
    p_verdict = sub.add_parser("verdict", help="a decision's verdict on requests (granted, declined, or not yet "
                               "decided): what a requester asks")
    p_verdict.add_argument("topology")
    p_verdict.add_argument("decision")
    p_verdict.add_argument("request_ids", nargs="+", metavar="REQUEST_ID")
    p_register = sub.add_parser("register", help="register the topologies that DAG files declare (as the schema's "
                                "owner: creates their tables; the run-time role then needs no DDL rights)")
    p_register.add_argument("dag_files", nargs="+", metavar="DAG_FILE")
    p_grant = sub.add_parser("grant", help="grant a run-time role (and a producer role) what they need, no more; "
                             "run as the schema's owner after registering")
    p_grant.add_argument("--runtime-role", required=True, help="the role Airflow's tasks connect as")
    p_grant.add_argument("--producer-role", help="a role that may only append to the logs given with --log")
    p_grant.add_argument("--log", action="append", default=[], help="a log the producer role may append to")
    p_grant.add_argument("--print", action="store_true", help="print the SQL instead of running it")
    p_reset = sub.add_parser("reset", help="forget a topology's progress and drop its state tables: its next run "
                             "starts over from the beginning of its source (after a changed declaration)")
    p_reset.add_argument("topology")
    p_reset.add_argument("--yes", action="store_true", help="really do it (pause the DAG first)")
    p_recover = sub.add_parser("recover", help="discard staged output that can never commit")
    p_recover.add_argument("topology")
    p_audit = sub.add_parser("audit", help="recompute the state from the source in one Spark pass and diff it")
    p_audit.add_argument("topology")
    p_audit.add_argument("--dag-file", help="the DAG file that declares the topology: its Spark job is run from it "
                         "(required; a store whose declaration differs is refused)")
    p_audit.add_argument("--master", default=os.environ.get("AIRFLOW_TXN_SPARK_MASTER", "local[2]"),
                         help="Spark master (default local[2]; e.g. spark://host:7077)")
    p_audit.add_argument("--conf", action="append", default=[], help="extra Spark conf key=value")
    p_audit.add_argument("--json", action="store_true")
    p_rebuild = sub.add_parser("rebuild", help="recompute the state from the source and swap it in, live")
    p_rebuild.add_argument("topology")
    p_rebuild.add_argument("--dag-file", help="the DAG file that declares the topology (required but with --abort)")
    p_rebuild.add_argument("--master", default=os.environ.get("AIRFLOW_TXN_SPARK_MASTER", "local[2]"))
    p_rebuild.add_argument("--conf", action="append", default=[], help="extra Spark conf key=value")
    p_rebuild.add_argument("--abort", action="store_true", help="forget a rebuild that died half-way")
    p_rebuild.add_argument("--force", action="store_true", help="with --abort: abort a rebuild that is still running")
    p_cds = sub.add_parser("spark-cds", help="build the class-data-sharing archive that saves a small batch's "
                           "spark-submit about a fifth of its CPU and time (once per machine; needs no state store)")
    p_cds.add_argument("--force", action="store_true", help="build it again even if a verified one exists")
    args = parser.parse_args(argv)

    if args.command == "spark-cds":
        return build_startup_archive(force=args.force)
    if args.command == "reset" and not args.yes:
        raise ConfigError(f"reset drops the state tables of {args.topology} and its progress: pause its DAG, "
                          f"then run 'airflow-txn reset {args.topology} --yes'")
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
            if args.json:
                for r in rows:
                    print(json.dumps(r, default=str, sort_keys=True))
            else:
                _print_commits(rows)
            return 0
        if args.command == "verdict":
            found = coord.verdicts(args.topology, args.decision, args.request_ids)
            for rid in args.request_ids:
                v = found.get(rid)
                print(f"{rid}: " + ("not decided yet" if v is None else
                                    f"{'granted' if v['granted'] else 'declined'} in txid {v['txid']} "
                                    f"(amount {v['amount']}, balance after {v['balance_after']})"))
            return 0 if len(found) == len(set(args.request_ids)) else 4
        if args.command == "register":
            for spec in declared_topologies(args.dag_files):
                coord.register(spec)
                print(f"registered {spec.topology_id}")
            return 0
        if args.command == "grant":
            statements = coord.grant(runtime_role=args.runtime_role, producer_role=args.producer_role,
                                     logs=args.log, apply=not args.print)
            if args.print:
                print("\n".join(f"{stmt};" for stmt in statements))
            else:
                print(f"granted {args.runtime_role}" + (f" and {args.producer_role}" if args.producer_role else ""))
            return 0
        if args.command == "reset":
            done = coord.reset(args.topology)
            print(f"reset {args.topology}: its next run starts from the beginning of its source; dropped "
                  f"{', '.join(done.dropped) or 'no tables'}")
            if done.kept:
                print(f"kept {', '.join(done.kept)}: not made by the topology's registration (drop it yourself "
                      "if you mean to)")
            return 0
        if args.command == "audit":
            spec = declared_here(coord, args.topology, args.dag_file, "audit")
            result = run_job(coord, spec, "audit", master=args.master, conf=args.conf)
            if args.json:
                print(json.dumps(result, indent=2, default=str))
            elif not result.get("auditable"):
                print(f"cannot audit {args.topology}: {result.get('reason')}")
            else:
                print(f"audit of {args.topology} at committed txid {result['committed_txid']}: "
                      f"{result['differences']} difference(s)")
                for name, st in result["states"].items():
                    print(f"  {name:<24} {st['keys']} keys, {st['differences']} differ")
                print(f"  quarantine               {result['quarantined_committed']} committed, "
                      f"{result['quarantined_recomputed']} recomputed")
                for line in result["samples"]:
                    print(f"  {line}")
            return 0 if result.get("auditable") and not result.get("differences") else 1
        if args.command == "rebuild":
            if args.abort:
                if rebuild.abort(coord, args.topology, force=args.force):
                    print(f"rebuild of {args.topology} aborted; its journal was freed")
                else:
                    print(f"{args.topology} has no rebuild to abort")
                return 0
            spec = declared_here(coord, args.topology, args.dag_file, "rebuild")
            result = run_job(coord, spec, "rebuild", master=args.master, conf=args.conf)
            print(f"rebuilt {args.topology} from its source as of txid {result['rebuilt_at_txid']}, replayed "
                  f"{result['journal_txids']} txids committed meanwhile (now at txid {result['caught_up_to_txid']})")
            return 0
        if args.command == "recover":
            res = coord.recover(args.topology)
            print(f"discarded {res.attempts_discarded} attempts, {res.staged_rows_deleted} staged rows, "
                  f"{res.quarantine_rows_deleted} quarantine rows")
            return 0
    finally:
        coord.close()
    return 1


if __name__ == "__main__":
    sys.exit(main())
