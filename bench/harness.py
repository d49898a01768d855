"""The Airflow side of ``bench.perf``: a stack of its own (Postgres, Airflow, a Spark Connect
server), the benchmark's DAGs deployed into it, runs triggered and awaited over REST, and what a
set of runs achieved (events/s from the first run's start to the last commit)."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow_transactional.coordinator import Coordinator
from bench.measure import (
    BACKENDS,
    CLUSTER_DAG,
    REPO,
    SCALE_NOOP,
    SCALE_TOPOLOGIES,
    MemorySampler,
    Report,
    Row,
    Sizes,
    parse_ts,
    write_events_file,
)
from bench.sections import waits
from dev.localstack import LocalStack, RestClient

log = logging.getLogger("bench.perf")

DAG_FILES = sorted((REPO / "bench" / "dags").glob("bench_*.py"))


def cluster_entry(sizes: Sizes) -> dict[str, Any]:
    """The ``bench_words.json`` entry of the topology the ``cluster`` section runs on this Airflow
    and on the cluster stack."""
    return {"name": CLUSTER_DAG, "landing": None, "max_in_flight": sizes.max_in_flight,
            "batch": sizes.cluster_batch, "connect": False}


class Harness:
    """One benchmark run's Airflow: its directories, stack, memory sampler and REST client."""

    def __init__(self, base: Path, sizes: Sizes, report: Report, sections: tuple[str, ...],
                 pg_settings: dict[str, str] | None = None) -> None:
        self.base, self.sizes, self.report, self.sections = base, sizes, report, sections
        self.dags = base / "dags"
        self.data = base / "data"
        self.memory = MemorySampler()
        self.stack = LocalStack(base, self.dags, spark_connect=True)
        self.stack.pg.settings.update(pg_settings or {})
        self.day0 = datetime(2026, 6, 1, tzinfo=UTC)
        self.triggered = 0
        self._client: RestClient | None = None
        self.throwaway = False  # a run in a temporary directory: its stack's data is removed at its end

    @property
    def client(self) -> RestClient:
        if self._client is None:
            self._client = self.stack.client()
        return self._client

    def write_dags(self) -> None:
        """Deploy the benchmark's DAG files (``bench/dags/``) and the configurations they build."""
        self.dags.mkdir(parents=True, exist_ok=True)
        for dag_file in DAG_FILES:
            (self.dags / dag_file.name).symlink_to(dag_file)
        s, words = self.sizes, []
        for suffix in BACKENDS.values():
            for name, mif in ((f"bench_serial{suffix}", 1), (f"bench_pipelined{suffix}", s.max_in_flight)):
                words.append({"name": name, "landing": None, "max_in_flight": mif, "batch": s.pipeline_batch,
                              "connect": bool(suffix)})
            for size in s.peer_batches:
                name = f"bench_landing_{size}{suffix}"
                landing = self.base / "landing" / name
                landing.mkdir(parents=True, exist_ok=True)
                words.append({"name": name, "landing": str(landing), "max_in_flight": s.max_in_flight, "batch": 1,
                              "connect": bool(suffix)})
        words += waits.dags()
        words.append(cluster_entry(s))
        (self.dags / "bench_words.json").write_text(json.dumps(words, indent=1))

    def dag_ids(self) -> list[str]:
        """The DAGs :meth:`write_dags` deployed: one per file, bench_words.py's from its JSON and
        bench_scale.py's."""
        words = json.loads((self.dags / "bench_words.json").read_text())
        scale = {f"bench_scale_{i}" for i in range(SCALE_TOPOLOGIES)} | {SCALE_NOOP}
        return sorted({d.stem for d in self.dags.glob("*.py")} - {"bench_words", "bench_scale"}
                      | {w["name"] for w in words} | scale)

    # -- runs over REST --------------------------------------------------------------------

    def trigger(self, dag_id: str) -> str:
        self.triggered += 1
        when = (self.day0 + timedelta(minutes=self.triggered)).isoformat()
        return str(self.client.trigger(dag_id, when, f"bench-{self.triggered:04d}")["dag_run_id"])

    def wait_runs(self, dag_id: str, run_ids: list[str], timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = [self.client.run(dag_id, r) for r in run_ids]
            if all(r["state"] in ("success", "failed") for r in runs):
                failed = [r["dag_run_id"] for r in runs if r["state"] != "success"]
                if failed:
                    raise RuntimeError(f"{dag_id}: runs {failed} failed; see {self.base / 'logs'}")
                return runs
            time.sleep(1)
        raise TimeoutError(f"{dag_id}: runs {run_ids} unfinished after {timeout:.0f} s")

    def settle(self, dag_ids: list[str]) -> None:
        """Unpause and let the one scheduled run each DAG gets on unpause finish (it is empty)."""
        for d in dag_ids:
            self.client.wait_for_dag(d)
            self.client.unpause(d)
        deadline = time.monotonic() + 300
        for d in dag_ids:
            while time.monotonic() < deadline:
                runs = self.client.runs(d)
                if runs and all(r["state"] in ("success", "failed") for r in runs):
                    break
                time.sleep(1)

    def commits(self, topology: str, run_ids: list[str]) -> list[dict[str, Any]]:
        coord = Coordinator(self.stack.state_dsn)
        try:
            return [c for c in coord.commits(topology) if c["run_key"] in run_ids]
        finally:
            coord.close()

    def throughput(self, dag_id: str, run_ids: list[str], timeout: float) -> tuple[float, int, float]:
        """(events/s, events, seconds): first run's start to the last commit of these runs."""
        runs = self.wait_runs(dag_id, run_ids, timeout)
        commits = self.commits(dag_id, run_ids)
        assert len(commits) == len(run_ids), (dag_id, len(commits), len(run_ids))
        txids = [c["txid"] for c in sorted(commits, key=lambda c: c["committed_at"])]
        assert txids == sorted(txids), f"{dag_id}: commits out of txid order: {txids}"
        start = min(parse_ts(r["start_date"]) for r in runs)
        end = max(c["committed_at"] for c in commits)
        events = sum(int(c["records_read"] or 0) for c in commits)
        seconds = (end - start).total_seconds()
        return events / seconds, events, seconds

    def batch_files(self, size: int) -> list[Path]:
        folder = self.data / str(size)
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        for i in range(self.sizes.batches_of(size)):
            path = folder / f"events-{i:03d}.json"
            if not path.exists():
                log.info("peer: writing %s (%d events)", path, size)
                write_events_file(path, size, seed=size + i, distinct_urls=self.sizes.distinct_urls)
            files.append(path)
        return files

    def memory_rows(self) -> None:
        """The report's rows of the peak memory of each Spark process tree the run measured."""
        for label, peak in sorted(self.memory.peaks.items()):
            what = ("Structured Streaming peer (its driver + Python workers)" if label.startswith("peer-")
                    else "Spark Connect server, all batches (JVM + Python workers)" if label.endswith("_sc")
                    else "processing task (spark-submit driver + Python workers)")
            self.report.add(Row("peak memory", f"{what}: {label}", f"{peak / 2**20:,.0f} MiB", "", None))
