"""dev/cluster.py without starting anything: what the cluster stack configures, and how it finds
and kills a lost host's processes."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from dev.cluster import ClusterStack, descendants, kill_tree

pytestmark = pytest.mark.unit


def test_the_cluster_stack_runs_tasks_on_celery_and_spark_on_its_standalone_master(tmp_path: Path) -> None:
    (tmp_path / "stack").mkdir()
    stack = ClusterStack(tmp_path / "stack", tmp_path / "dags")
    env = stack.env()
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://:")
    assert env["AIRFLOW__CELERY__BROKER_URL"].endswith(f"@127.0.0.1:{stack.redis.port}/0")  # loopback, a password
    spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert (spark["host"], spark["port"]) == ("spark://127.0.0.1", stack.spark.port)
    assert stack.components[-2:] == ("worker-1", "worker-2")
    assert len(set(stack.log_ports.values())) == 2  # two workers on one host: a log server each
    assert (stack.redis.base_dir / "password").stat().st_mode & 0o077 == 0


def test_a_lost_hosts_process_tree_is_found_and_killed_whole() -> None:
    # A worker whose task started a process in a session of its own (as spark-submit may): that
    # one dies with the worker too.
    root = subprocess.Popen(["sh", "-c", "setsid sleep 60 & sleep 60 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(tree := descendants(root.pid)) < 3:
            assert time.monotonic() < deadline, tree
            time.sleep(0.1)
        kill_tree(root.pid)
        root.wait(10)
        time.sleep(0.2)
        assert not [pid for pid in tree[1:] if Path(f"/proc/{pid}").exists()
                    and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:1]]
    finally:
        root.kill()


def test_a_machine_without_redis_server_is_told_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dev.cluster import RedisServer
    from dev.restclient import AirflowStackError

    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server on it
    with pytest.raises(AirflowStackError, match=r"redis-server not found: .*apt-get install redis-server"):
        RedisServer(tmp_path / "redis").start()
