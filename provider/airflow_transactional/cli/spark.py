"""What runs Spark over a whole topology -- an audit, a rebuild -- and Spark's set-up on a machine
(its class-data-sharing archive, the connectors' jars), which needs no state store."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from ..airflow.dagfile import declared_as_stored
from ..coordinator import Audit, Coordinator, Rebuild, StateBuild
from ..exceptions import TransactionalError
from ..model import duration
from ..spark import cds, jars
from ..spark.recompute import recompute
from .args import on_spark, spark_target


def _committed_records(coord: Coordinator, topology_id: str) -> int:
    """The records the topology's commits read: what a recomputation reads again."""
    return sum(int(c.get("records_read") or 0) for c in coord.commits(topology_id))


def audit(args: argparse.Namespace, coord: Coordinator) -> int:
    spec = declared_as_stored(coord.spec(args.topology), args.dag_file, "audit")
    result = recompute(coord.dsn, coord.schema, spec, Audit(args.topology), **on_spark(args),
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
    result = recompute(coord.dsn, coord.schema, spec, Rebuild(args.topology), **on_spark(args),
                       records=_committed_records(coord, args.topology))
    print(f"rebuilt {args.topology} from its source as of txid {result['rebuilt_at_txid']}, replayed "
          f"{result['journal_txids']} txids committed meanwhile (now at txid {result['caught_up_to_txid']})")
    return 0


def evolve(args: argparse.Namespace, coord: Coordinator) -> int:
    """What a topology's DAG file adds, and the build of it: shown, approved (built from the
    source's history and switched in while the topology commits) or cancelled."""
    topology_id = args.topology
    if args.cancel:
        names = coord.cancel_build(topology_id)
        print(f"state build of {topology_id} cancelled: {', '.join(names)} declared again (their rows are dropped "
              "until approved)" if names else f"{topology_id} has no state being built")
        return 0
    if args.drop:
        dropped = coord.drop_retired(topology_id, args.drop)
        print(f"retired state {args.drop} of {topology_id} dropped: {', '.join(dropped) or 'no table of its own'}")
        return 0
    if not args.approve:
        print(evolution_text(coord.evolution(topology_id)))
        return 0
    spec = declared_as_stored(coord.spec(topology_id), args.dag_file, "evolve")
    for name, txid in coord.retire_states(topology_id).items():
        print(f"retired {name} of {topology_id} at txid {txid}: no commit after it keeps it; its table stays as it "
              f"was (drop it with 'airflow-txn evolve {topology_id} --drop {name}')")
    st = coord.evolution(topology_id)
    if not (st["declared"] or st["building"]):
        return 0
    result = recompute(coord.dsn, coord.schema, spec, StateBuild(topology_id), **on_spark(args),
                       records=_committed_records(coord, topology_id))
    rows = ", ".join(f"{name} ({n} keys)" for name, n in result["states"].items())
    print(f"built {rows} of {topology_id} from its source as of txid {result['built_at_txid']}, caught up over "
          f"{result['journal_txids']} txids committed meanwhile; switched in at txid {result['switched_at_txid']}: "
          "every commit from the next on keeps it")
    return 0


def evolution_text(st: Mapping[str, Any]) -> str:
    """``airflow-txn evolve TOPOLOGY``'s account of its states' stages."""
    topology_id, labels = st["topology"], dict(st.get("labels") or {})
    lines = [f"topology {topology_id} at committed txid {st['committed_txid']}"]
    if st["declared"]:
        lines.append(f"  declared, not kept yet: {', '.join(labels.get(n, n) for n in st['declared'])} (its DAG "
                     "file adds or redefines them; build them from "
                     f"the source's history with 'airflow-txn evolve {topology_id} --approve --dag-file DAG_FILE')")
    if st["building"]:
        through = st["building_through_txid"]
        lines.append(f"  building: {', '.join(labels.get(n, n) for n in st['building'])} (every attempt stages "
                     "them, no commit applies them "
                     + (f"yet; the build folds txids 1..{through} of the source's history" if through is not None
                        else "yet; the build's process is gone: approve again to take it up, or --cancel") + ")")
        if st.get("progress"):
            p = st["progress"]
            lines.append(f"    folded through txid {p['through_txid']} of {p['of_txid']} ({p['records']:,} of "
                         f"{p['of_records']:,} records)" + (f", ETA {duration(p['eta_seconds'])}"
                                                            if p["eta_seconds"] is not None else ""))
    for name, txid in dict(st["built"]).items():
        lines.append(f"  built: {name} as of txid {txid} (its delta history and verification start there)")
    if st["retiring"]:
        lines.append(f"  retiring: {', '.join(st['retiring'])} (its DAG file no longer declares them; the commits "
                     f"keep them until 'airflow-txn evolve {topology_id} --approve')")
    for name, txid in dict(st["retired"]).items():
        lines.append(f"  retired: {labels.get(name, name)} at txid {txid} (its table kept as it was; "
                     f"'airflow-txn evolve {topology_id} --drop {name}' drops it)")
    if len(lines) == 1:
        lines.append("  every state it declares is live")
    return "\n".join(lines)


def spark_cds(args: argparse.Namespace) -> int:
    """Build the class-data-sharing archive (no state store needed)."""
    if not cds.enabled():
        print(f"{cds.SWITCH_ENV} is off: Spark drivers start without a class-data-sharing archive")
        return 0
    found = None if args.force else cds.current()
    try:
        startup = found or cds.build(force=args.force)
    except TransactionalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot write the archive under {cds.cache_dir()} ({exc.strerror}): set "
              f"{cds.DIR_ENV} to a writable directory", file=sys.stderr)
        return 1
    shared = f" (shared by every install of these Spark jars: {startup.spark_home})" if startup.spark_home else ""
    print(f"class-data-sharing archive {'already built' if found else 'built'}: {startup.archive}{shared}")
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


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Audit and rebuild, and Spark's set-up on this machine, with ``command(name, func, help,
    topology=True)`` (the CLI's subparser factory)."""
    made = {}
    for name, func, text in (("audit", audit, "recompute the state from the source in one Spark pass and diff it"),
                             ("rebuild", rebuild, "recompute the state from the source and swap it in, live")):
        one = made[name] = command(name, func, text)
        one.add_argument("--dag-file", help="the DAG file that declares the topology: its Spark job is run from it "
                         "(a store whose declaration differs is refused)" +
                         (" (not needed with --abort)" if name == "rebuild" else ""))
        spark_target(one)
    evolving = command("evolve", evolve, "show the states a DAG file adds to or drops from a running topology; "
                       "--approve builds the added ones from the source's history while it commits and switches "
                       "them in at one txid, and retires the dropped ones")
    evolving.add_argument("--approve", action="store_true", help="retire the states the DAG file dropped, build the "
                          "ones it added and switch them in")
    evolving.add_argument("--cancel", action="store_true", help="forget a build that has not switched in")
    evolving.add_argument("--drop", metavar="STATE", help="drop a retired state's tables")
    evolving.add_argument("--dag-file", help="with --approve: the DAG file that declares the topology (its Spark job "
                          "runs the build)")
    spark_target(evolving)
    made["audit"].add_argument("--json", action="store_true")
    made["rebuild"].add_argument("--abort", action="store_true", help="forget a rebuild that died half-way")
    made["rebuild"].add_argument("--force", action="store_true", help="with --abort: abort a rebuild still running")
    command("spark-cds", spark_cds, "build the class-data-sharing archive that saves a small batch's "
            "spark-submit about a fifth of its CPU and time (once per machine; needs no state store)",
            topology=False).add_argument("--force", action="store_true",
                                         help="build it again even if a verified one exists")
    command("fetch-jars", fetch_jars, "fetch Spark's Kafka connector and Hadoop's s3a for the installed Spark "
            "with Maven (once per machine; needs no state store)", topology=False)


#: Commands that need no state store.
NO_STORE = (spark_cds, fetch_jars)
