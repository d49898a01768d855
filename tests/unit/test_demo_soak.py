"""The demo soak's verdict on a topology's lag (bench/demo_soak.py), on made-up samples."""

from __future__ import annotations

import pytest

from bench.demo_soak import judge

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("samples", "verdict"), [
    ([100, 900, 300, 800, 200, 700], "bounded"),        # a saw: every batch catches up
    ([0, 5000, 9000, 400, 300, 200], "bounded"),        # a backlog worked off
    ([100, 200, 300, 400, 500, 600], "grows"),          # every late sample above all earlier ones
    ([100, 5000, 300, 400, 4900, 5200], "bounded"),     # the last third not all above the first two
    ([1, 2], "too short"),
])
def test_a_lag_is_bounded_unless_the_last_third_stays_above_everything_before(samples: list[int],
                                                                           verdict: str) -> None:
    assert judge(samples) == verdict


def test_the_seconds_between_commits_count_only_the_runs_own() -> None:
    from datetime import UTC, datetime, timedelta

    from airflow_transactional.exceptions import UnknownTopology
    from bench.demo_soak import commit_gaps

    start = datetime(2026, 12, 7, tzinfo=UTC)

    class Log:
        def commits(self, topology_id: str) -> list[dict[str, datetime]]:
            if topology_id != "words":
                raise UnknownTopology(topology_id)
            return [{"committed_at": start + timedelta(seconds=s)} for s in (-60, 0, 4, 6, 30)]

    assert commit_gaps(Log(), "words", start) == {"p50": 4.0, "max": 24.0}  # type: ignore[arg-type]
    assert commit_gaps(Log(), "words", start + timedelta(seconds=10)) is None  # one commit since
    assert commit_gaps(Log(), "payments", start) is None  # never planned


def test_a_registered_topology_whose_status_cannot_be_read_stops_the_soak() -> None:
    """Regression: the demo's DSN file became JSON (the S3 connection kept with the DSN), the soak
    read it as a DSN, every status failed, and the report said 0 commits for every topology."""
    import argparse
    from types import SimpleNamespace

    from airflow_transactional.exceptions import ConfigError, UnknownTopology
    from bench.demo_soak import Soak

    class Store:
        registered = ["words"]

        def topologies(self) -> list[SimpleNamespace]:
            return [SimpleNamespace(topology_id=t) for t in self.registered]

        def status(self, topology_id: str) -> SimpleNamespace:
            if topology_id not in self.registered:
                raise UnknownTopology(topology_id)
            if topology_id == "words" and not self.readable:
                raise ConfigError("the PostgreSQL DSN is malformed")
            return SimpleNamespace(lag=5, committed_txid=2, in_flight=[SimpleNamespace(txid=3, phase="failed"),
                                                                        SimpleNamespace(txid=4, phase="planned")])

        readable = True

    soak = Soak(argparse.Namespace(dir="/nonexistent", seed=1, minutes=1, spark_connect=True, kill_every=0, rate=50))
    store = Store()
    soak.sample(store)  # type: ignore[arg-type]
    assert soak.lags["words"] == [5] and soak.lags["payments"] == []  # not registered yet: skipped
    assert soak.failed == {"words": [3]}  # a try of txid 3 failed
    report = soak.report(60.0, 0, [])["topologies"]["words"]
    assert report["failed_tries"] == [3] and report["failed_uncommitted"] == [3]  # still not committed: jammed
    soak.committed["words"].append(3)
    assert soak.report(60.0, 0, [])["topologies"]["words"]["failed_uncommitted"] == []  # retried and committed
    store.readable = False
    with pytest.raises(ConfigError):
        soak.sample(store)  # type: ignore[arg-type]


def test_the_soak_kills_a_batchs_own_process_never_the_spark_connect_server() -> None:
    """Regression: on Spark Connect the soak took the server (a SparkSubmit JVM too) for a batch's
    driver, killed it, and every topology of the demo stalled."""
    from bench.demo_soak import drivers

    class Proc:
        def __init__(self, pid: int, argv: list[str], parents: list[Proc] = ()) -> None:  # type: ignore[assignment]
            self.pid, self.argv, self._parents = pid, argv, list(parents)

        def cmdline(self) -> list[str]:
            return self.argv

        def parents(self) -> list[Proc]:
            return self._parents

    submit = ["/usr/bin/java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit"]
    server = Proc(1, [*submit, "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"])
    driver = Proc(2, [*submit, "--name", "txn-words", "words.py"])
    drivers_python = Proc(3, ["python", "words.py", "--topology", "words", "--txid", "7"], [driver])
    client = Proc(4, ["python", "words.py", "--topology", "kafka_words", "--txid", "9"])

    class Root:
        def children(self, recursive: bool) -> list[Proc]:
            return [server, driver, drivers_python, client]

    assert drivers(Root()) == {2: "words", 4: "kafka_words"}  # type: ignore[arg-type]
