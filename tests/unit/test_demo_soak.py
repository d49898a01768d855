"""The demo soak's verdict on a topology's lag (bench/demo_soak.py), on made-up samples; and the
Spark the demo picks for the machine it runs on."""

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
            return SimpleNamespace(lag=5, committed_txid=2)

        readable = True

    soak = Soak(argparse.Namespace(dir="/nonexistent", seed=1))
    store = Store()
    soak.sample(store)  # type: ignore[arg-type]
    assert soak.lags["words"] == [5] and soak.lags["payments"] == []  # not registered yet: skipped
    store.readable = False
    with pytest.raises(ConfigError):
        soak.sample(store)  # type: ignore[arg-type]


@pytest.mark.parametrize(("cores", "argv", "connect", "chosen_for"), [
    (2, [], True, 2),                      # a small machine: Spark Connect, and the banner says why
    (8, [], False, None),                  # a driver JVM per batch keeps up there
    (2, ["--spark-submit"], False, None),  # make demo SPARK_CONNECT=0
    (8, ["--spark-connect"], True, None),  # make demo SPARK_CONNECT=1
    (2, ["--cluster"], False, None),       # the cluster's own drivers, unless asked
])
def test_the_demo_runs_its_batches_on_spark_connect_on_a_small_machine_unless_told(
        monkeypatch: pytest.MonkeyPatch, cores: int, argv: list[str], connect: bool, chosen_for: int | None) -> None:
    from dev import demo

    monkeypatch.setattr(demo.os, "cpu_count", lambda: cores)
    args = demo.parse_args(argv)
    assert (args.spark_connect, args.connect_chosen_for) == (connect, chosen_for)
    with pytest.raises(SystemExit):
        demo.parse_args(["--spark-submit", "--spark-connect"])
