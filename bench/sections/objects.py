"""The ``objects`` section of ``bench.perf``: landing directories on S3 (S3Proxy, read with s3a)
and HDFS (a NameNode and a DataNode, read with Spark's HDFS client), against a local one.

- Events/s of one batch file, the same ``spark-submit`` of ``words`` the work section runs, on the
  file in an S3 bucket and in HDFS vs the same file in a local landing directory (trials alternate).
- A plan's wall time with ``listing="incremental"`` when the prefix already holds a large number of
  files vs a small one, the same few new files each time: what a plan's cost grows with. Setup:
  the files are uploaded (S3) or created by Hadoop's shell (HDFS, empty files), and the first plan
  takes them all (its time is in the note).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airflow_transactional.connections import Connections, settings_of
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.sources import LandingDirectory, ObjectLanding
from airflow_transactional.spark.jars import s3a_connector
from airflow_transactional.spec import StateSpec, TopologySpec
from bench.measure import Report, Row, Sizes, execute, median
from bench.sections.work import Work, words_topology
from dev.hdfs import HdfsCluster
from dev.s3 import S3Server

log = logging.getLogger("bench.perf")

BUCKET = "bench-landing"
S3_CONN, HDFS_CONN = "bench_s3", "bench_hdfs"


class Stores(Work):
    """One batch file in a local landing directory, an S3 bucket and HDFS, a words topology on each."""

    def __init__(self, dsn: str, schema: str, base: Path, events_file: Path, size: int, conf: dict[str, str],
                 s3: S3Server, hdfs: HdfsCluster, connections: Connections) -> None:
        self._prepare(dsn, schema, base, events_file, size, conf)
        self.env.update({f"AIRFLOW_CONN_{S3_CONN.upper()}": s3.airflow_connection(),
                         f"AIRFLOW_CONN_{HDFS_CONN.upper()}": hdfs.airflow_connection()})
        s3.create_bucket(BUCKET)
        s3.client().upload_file(str(events_file), BUCKET, f"work/{events_file.name}")
        hdfs.mkdirs("/work")
        hdfs.shell("-put", "-f", str(events_file), f"/work/{events_file.name}")
        coord = Coordinator(dsn, schema=schema, connections=connections)
        try:
            for name, source in (
                    ("bench_obj_local", LandingDirectory(str(base / "landing"), max_files=1, settle_seconds=0)),
                    ("bench_obj_s3", LandingDirectory(f"s3a://{BUCKET}/work", conn_id=S3_CONN, max_files=1,
                                                      settle_seconds=0)),
                    ("bench_obj_hdfs", LandingDirectory(f"{hdfs.url}/work", conn_id=HDFS_CONN, max_files=1,
                                                        settle_seconds=0))):
                coord.register(words_topology(name, source, 1))
                txn = coord.plan(name, "bench-objects")
                assert txn.planned_records == 1, (name, txn)
                self.txids[name] = txn.txid
                self.batches[name] = (txn.batch, txn.planned_records)
        finally:
            coord.close()


def _fill_s3(s3: S3Server, prefix: str, names: list[str]) -> None:
    """``names`` as one-line objects under ``prefix`` of the bucket."""
    client = s3.client()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: client.put_object(Bucket=BUCKET, Key=f"{prefix}/{n}", Body=b'{"url": "x"}\n'),
                      names))


def _fill_hdfs(hdfs: HdfsCluster, prefix: str, names: list[str]) -> None:
    """``names`` as empty files in HDFS's ``/prefix`` (Hadoop's shell, 5,000 a JVM)."""
    for lo in range(0, len(names), 5000):
        hdfs.shell("-touchz", *(f"/{prefix}/{n}" for n in names[lo:lo + 5000]))


def _plan_times(dsn: str, schema: str, connections: Connections, s3: S3Server, hdfs: HdfsCluster, n: int,
                sizes: Sizes) -> dict[str, tuple[float, float, float]]:
    """Per store: (median wall s of a plan that finds ``objects_new`` new files beside ``n``, the first
    plan's, one LIST request after the last name alone)."""
    prefix = f"plan{n}"
    hdfs.mkdirs(f"/{prefix}")
    fills = {"S3": lambda names: _fill_s3(s3, prefix, names), "HDFS": lambda names: _fill_hdfs(hdfs, prefix, names)}
    coord = Coordinator(dsn, schema=schema, connections=connections)
    out = {}
    try:
        for store, url, conn in (("S3", f"s3a://{BUCKET}/{prefix}", S3_CONN),
                                 ("HDFS", f"{hdfs.url}/{prefix}", HDFS_CONN)):
            started = time.perf_counter()
            fills[store]([f"f{i:07d}.json" for i in range(n)])
            log.info("objects: %d files in %s in %.0f s", n, store, time.perf_counter() - started)
            topo = f"bench_plan_{store.lower()}_{n}"
            source = ObjectLanding(url, conn_id=conn, listing="incremental", settle_seconds=0, max_files=100_000)
            state = StateSpec("c", keys={"k": "text"}, combiner="count", table=topo)
            coord.register(TopologySpec(topo, source, [state], max_in_flight=sizes.objects_trials + 2))
            t0 = time.perf_counter()
            assert coord.plan(topo, "first").planned_records == n  # the first look lists and registers all
            first = time.perf_counter() - t0
            # As autovacuum keeps the tables in a steady state: no plan measured beside its pass over
            # the rows just registered, or before their statistics exist.
            execute(dsn, f"VACUUM ANALYZE {schema}.landing_files", f"VACUUM ANALYZE {schema}.transactions",
                    autocommit=True)
            took = []
            for trial in range(sizes.objects_trials):
                fills[store]([f"g{trial:03d}-{i:03d}.json" for i in range(sizes.objects_new)])  # after every f...
                t0 = time.perf_counter()
                assert coord.plan(topo, f"r{trial}").planned_records == sizes.objects_new
                took.append(time.perf_counter() - t0)
            last = f"{url}/g{sizes.objects_trials - 1:03d}-{sizes.objects_new - 1:03d}.json"
            listed = _one_list(url, conn, connections, last)
            out[store] = (median(took), first, listed)
            log.info("objects: %s, %d files: plans %s ms (the first %.1f s)", store, n,
                     " ".join(f"{t * 1000:.0f}" for t in took), first)
    finally:
        coord.close()
    return out


def _one_list(url: str, conn: str, connections: Connections, after: str) -> float:
    """Wall s of the one LIST request an incremental plan sends (names after ``after``), alone."""
    store = ObjectLanding(url, conn_id=conn, connections=connections).store
    took = []
    for _ in range(3):  # the first also makes the client and its connection
        t0 = time.perf_counter()
        assert list(store.listing(after)) == []
        took.append(time.perf_counter() - t0)
    return median(took[1:])


def run(dsn: str, schema: str, base: Path, events_file: Path, sizes: Sizes, report: Report,
        conf: dict[str, str]) -> None:
    s3, hdfs = S3Server(base / "s3").start(), HdfsCluster(base / "hdfs").start()
    try:
        connections = Connections(known={S3_CONN: settings_of("aws", **_fields(s3.connection())),
                                         HDFS_CONN: settings_of("webhdfs", **_fields(hdfs.connection()))})
        _read_rows(Stores(dsn, schema, base, events_file, sizes.work_batch, conf, s3, hdfs, connections),
                   sizes, report)
        small = _plan_times(dsn, schema, connections, s3, hdfs, sizes.objects_small, sizes)
        large = _plan_times(dsn, schema, connections, s3, hdfs, sizes.objects_large, sizes)
    finally:
        s3.stop(remove=True)
        hdfs.stop(remove=True)
    for store, target in (("HDFS", 1.5), ("S3", None)):
        ratio = large[store][0] / small[store][0]
        note = (f"first plans (list and register them all): {large[store][1]:.1f} s vs {small[store][1]:.1f} s; "
                f"median of {sizes.objects_trials}")
        note += f"; of which the one LIST request: {large[store][2] * 1000:.0f} ms vs {small[store][2] * 1000:.0f} ms"
        if store == "S3":
            note += ("; S3Proxy reads its whole directory for every LIST request, StartAfter or not (S3 pages "
                     "by key): that request is the server's share, which grows with all the files (no goal on "
                     "this server); the rest of the plan is the planner's")
        report.add(Row("objects", f"plan that finds {sizes.objects_new} new files, listing='incremental', {store} "
                                  f"prefix of {sizes.objects_large:,} vs {sizes.objects_small:,} files",
                       f"{large[store][0] * 1000:.0f} ms", f"{small[store][0] * 1000:.0f} ms", ratio,
                       f"<= {target}x" if target else "", ratio <= target if target else None, note))


def _fields(conn: dict[str, Any]) -> dict[str, Any]:
    return {k: conn.get(k) for k in ("host", "port", "login", "password", "extra")}


def _read_rows(stores: Stores, sizes: Sizes, report: Report) -> None:
    jars = [str(p) for p in s3a_connector().fetch()]
    took: dict[str, list[tuple[float, float]]] = {}
    for trial in range(sizes.work_trials):
        for topo in ("bench_obj_local", "bench_obj_s3", "bench_obj_hdfs"):
            c, w, _ = stores.ours(topo, jars=jars if topo == "bench_obj_s3" else ())
            took.setdefault(topo, []).append((c, w))
            log.info("objects: %s, trial %d: %.1f CPU-s, %.1f s wall", topo, trial, c, w)
    wall = {k: median([w for _, w in v]) for k, v in took.items()}
    cpu = {k: median([c for c, _ in v]) for k, v in took.items()}
    size = sizes.work_batch
    for topo, store, target in (("bench_obj_s3", "S3 (s3a, S3Proxy)", 0.8), ("bench_obj_hdfs", "HDFS", 0.9)):
        ratio = wall["bench_obj_local"] / wall[topo]
        report.add(Row("objects", f"events/s of one {size:,}-event batch file, landing directory on {store} vs on the "
                                  "local disk (spark-submit of words)",
                       f"{size / wall[topo]:,.0f} ev/s", f"{size / wall['bench_obj_local']:,.0f} ev/s", ratio,
                       f">= {target}x", ratio >= target,
                       f"CPU {cpu[topo]:.1f} vs {cpu['bench_obj_local']:.1f} CPU-s (whole process tree; the store's "
                       f"server not counted); median of {sizes.work_trials}"))
