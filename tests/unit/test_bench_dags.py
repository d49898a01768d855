"""The benchmark's and the chaos harness's DAGs are real files (``bench/dags/``): deployed the way
``bench.perf`` and ``bench.chaos`` deploy them, they load in Airflow with the settings each run
asks for."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.chaos import ChaosConfig, write_dag
from bench.harness import Harness as Bench
from bench.measure import SCALE_NOOP, SCALE_TOPOLOGIES, Sizes

pytestmark = pytest.mark.unit


def test_the_bench_and_chaos_dags_load_with_the_settings_of_their_run(tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    sizes = Sizes.quick()
    bench = SimpleNamespace(dags=tmp_path / "dags", base=tmp_path, sizes=sizes)
    Bench.write_dags(bench)  # type: ignore[arg-type]
    write_dag(bench.dags, ChaosConfig(max_in_flight=2, batch=123))

    bag = DagBag(dag_folder=str(bench.dags))
    assert sorted(bag.dag_ids) == Bench.dag_ids(bench)  # type: ignore[arg-type]  # what the bench waits for
    assert bag.import_errors == {}
    words = json.loads((bench.dags / "bench_words.json").read_text())
    scale = {f"bench_scale_{i}" for i in range(SCALE_TOPOLOGIES)} | {SCALE_NOOP}
    assert set(bag.dag_ids) == {e["name"] for e in words} | {"bench_empty", "bench_noop", "chaos_words"} | scale
    assert bag.dags["bench_scale_0"].max_active_runs == bag.dags[SCALE_NOOP].max_active_runs == 3
    serial, piped = bag.dags["bench_serial"], bag.dags["bench_pipelined_sc"]
    assert serial.max_active_runs == 1 and piped.max_active_runs == sizes.max_in_flight
    assert piped.get_task("process").spark_connect_conn_id == "spark_connect_default"
    assert serial.get_task("process").spark_connect_conn_id is None
    landing = bag.dags[f"bench_landing_{sizes.peer_batches[0]}"].get_task("plan").topology
    assert landing["source"]["kind"] == "landing" and landing["max_batch_size"] == 1
    assert bag.dags["bench_waits_deferred_0"].get_task("commit").deferrable is True
    assert bag.dags["bench_waits_sleeping_0"].get_task("commit").deferrable is False
    assert bag.dags["bench_waits_sleeping_0"].get_task("plan").deferrable is False
    chaos = bag.dags["chaos_words"].get_task("plan").topology
    assert (chaos["max_in_flight"], chaos["max_batch_size"]) == (2, 123)


def test_the_chaos_s3_dag_loads_as_an_opaque_landing_on_the_bucket(tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    write_dag(tmp_path, ChaosConfig(mode="s3", max_in_flight=2, batch=120, rate=6))
    bag = DagBag(dag_folder=str(tmp_path))
    assert bag.import_errors == {} and bag.dag_ids == ["chaos_s3"]
    topology = bag.dags["chaos_s3"].get_task("plan").topology
    assert topology["opaque"] is True and topology["max_in_flight"] == 2
    source = topology["source"]
    assert (source["kind"], source["path"], source["max_files"]) == ("landing", "s3a://chaos-landing/tweets", 20)
