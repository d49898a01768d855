"""The chaos harness's configuration: which fault kinds belong to which mode, stack and backend, the
quick sizes strike each of their kinds, and how each mode's topologies are deployed."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.chaos import ChaosConfig

pytestmark = pytest.mark.unit


def test_the_kafka_kinds_belong_to_the_kafka_mode_and_its_ci_size_strikes_each() -> None:
    from bench.chaos import KAFKA_KINDS, KINDS
    from bench.chaos.config import CORRECTION_KINDS
    from bench.chaos.faults import Faults
    from bench.chaos.kafka import MAX_PARTITIONS, PARTITIONS, partitions_cap

    assert ChaosConfig(mode="kafka").kinds == KINDS + KAFKA_KINDS  # the soak: every kind the mode has
    assert ChaosConfig().kinds == KINDS + CORRECTION_KINDS  # words: the operator's corrections too
    quick = ChaosConfig.quick(mode="kafka")
    assert set(KAFKA_KINDS) <= set(quick.kinds) and quick.faults >= len(quick.kinds)
    with pytest.raises(ValueError, match="the Kafka kinds strike a broker"):
        ChaosConfig(kinds=("spark_kill", "delete_records"))
    with pytest.raises(ValueError, match="unknown chaos mode 'kafak'"):
        ChaosConfig(mode="kafak")
    # The kafka kinds share one lane: the broker is struck by one fault at a time.
    lanes = Faults.plan(SimpleNamespace(cfg=quick, rng=random.Random(1)))  # type: ignore[arg-type]
    assert sorted(lanes["kafka"]) == sorted(KAFKA_KINDS)
    # A soak's add_partition faults all find room to strike (a topic capped at 8 partitions left
    # all but five of them missed).
    soak = ChaosConfig(mode="kafka", transactions=300, faults=300)
    planned = Faults.plan(SimpleNamespace(cfg=soak, rng=random.Random(1)))["kafka"].count(  # type: ignore[arg-type]
        "add_partition")
    assert planned > MAX_PARTITIONS - PARTITIONS and partitions_cap(soak) >= PARTITIONS + planned
    assert partitions_cap(quick) == MAX_PARTITIONS


def test_the_cluster_kinds_belong_to_the_cluster_stack_each_in_a_lane() -> None:
    from bench.chaos import KINDS
    from bench.chaos.config import CLUSTER_KINDS, LANES
    from bench.chaos.faults import Faults

    assert ChaosConfig(stack="cluster").kinds == KINDS + CLUSTER_KINDS  # the soak: every kind, mixed
    with pytest.raises(ValueError, match="the cluster kinds a cluster"):
        ChaosConfig(kinds=("spark_kill", "redis_restart"))
    with pytest.raises(ValueError, match="unknown stack 'k8s'"):
        ChaosConfig(stack="k8s")
    quick = ChaosConfig.quick(stack="cluster")
    assert set(CLUSTER_KINDS) <= set(quick.kinds) and quick.faults >= len(quick.kinds)
    lanes = Faults.plan(SimpleNamespace(cfg=quick, rng=random.Random(1)))  # type: ignore[arg-type]
    assert sorted(k for lane in lanes.values() for k in lane) == sorted(quick.kinds)  # none left out
    assert all(any(k in members for members in LANES.values()) for k in CLUSTER_KINDS)


def test_the_connect_backend_adds_the_server_s_loss_and_runs_the_topology_on_it(tmp_path: Path) -> None:
    from bench.chaos.config import CONNECT_KINDS, LANES, write_dag

    cfg = ChaosConfig(stack="cluster", backend="connect")
    assert set(CONNECT_KINDS) <= set(cfg.kinds) and any("spark_connect_kill" in m for m in LANES.values())
    quick = ChaosConfig.quick(seed=7, stack="cluster", backend="connect")
    plain = ChaosConfig.quick(seed=7, stack="cluster")
    assert quick.kinds == (*plain.kinds, "spark_connect_kill") and quick.faults == plain.faults + 1
    assert "kafka_kill_processing" in ChaosConfig(mode="kafka", backend="connect").kinds
    with pytest.raises(ValueError, match="need what this run lacks"):
        ChaosConfig(kinds=("spark_connect_kill",))  # a spark-submit run has no server to lose
    write_dag(tmp_path, cfg)
    assert json.loads((tmp_path / "chaos_words.json").read_text())["connect"] is True


def test_the_payments_example_runs_on_spark_connect_from_a_file_of_its_own(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """On Spark Connect the payments run deploys ``bench/dags/chaos_payments.py`` in place of the
    example: both stages' batches on the stack's server, from the example's own declarations."""
    import runpy

    from airflow_transactional.spark.submit import SPARK_CONNECT_CONN_ENV
    from bench.chaos.config import write_dag

    monkeypatch.setenv(SPARK_CONNECT_CONN_ENV, "")  # restored afterwards: the file sets it for its parse
    cfg = ChaosConfig.quick(seed=7, mode="payments", backend="connect")
    assert cfg.kinds[-1] == "spark_connect_kill"
    write_dag(tmp_path, cfg)
    assert [p.name for p in tmp_path.iterdir()] == ["chaos_payments.py"]
    found = runpy.run_path(str(tmp_path / "chaos_payments.py"))
    for dag_id in ("payments", "settlement"):
        process = found[dag_id].get_task("process")
        assert (found[dag_id].dag_id, process.spark_connect_conn_id) == (dag_id, "spark_connect_default")
        assert process.application.endswith(f"spark_jobs/{dag_id}.py")
    plain = tmp_path / "plain"
    plain.mkdir()
    write_dag(plain, ChaosConfig.quick(seed=7, mode="payments"))
    assert [p.resolve().name for p in plain.iterdir()] == ["payments.py"]


def test_the_store_kinds_belong_to_the_s3_mode_in_one_lane_and_its_ci_size_strikes_each() -> None:
    from bench.chaos import KINDS, OBJECT_KINDS
    from bench.chaos.faults import Faults

    assert ChaosConfig(mode="s3").kinds == KINDS + OBJECT_KINDS
    quick = ChaosConfig.quick(mode="s3")
    assert set(OBJECT_KINDS) <= set(quick.kinds) and quick.faults >= len(quick.kinds)
    with pytest.raises(ValueError, match="need what this run lacks"):
        ChaosConfig(kinds=("spark_kill", "object_overwrite"))
    lanes = Faults.plan(SimpleNamespace(cfg=quick, rng=random.Random(1)))  # type: ignore[arg-type]
    assert sorted(lanes["store"]) == sorted(OBJECT_KINDS)  # the store struck by one fault at a time
