"""The chaos harness at CI size on the cluster stack: the words topology on CeleryExecutor and a
Spark standalone cluster while a Celery worker is lost under a batch and another inside a held
commit, a Spark worker is lost with its executor, the Spark master restarts under a batch, Redis
restarts and a committed run is cleared -- then the oracle of the producers' ledger.

Its own stack (``bench.chaos.harness.chaos_stack``), started and removed here. ``make test`` runs
this module last in its e2e lane (dev/lanes.py), long after the other lane's cluster tests and
their ``cluster`` fixture ended; run with the tier alone, it comes before that fixture starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaos import KINDS, Chaos, ChaosConfig
from bench.chaos.config import CLUSTER_KINDS
from bench.chaos.harness import chaos_stack
from dev.localstack import LocalStack
from tests.e2e.conftest import exactly_once

pytestmark = pytest.mark.cluster

CHAOS_CLUSTER_CI = ChaosConfig.quick(seed=7, stack="cluster")


@pytest.fixture
def chaos_cluster(tmp_path: Path) -> Iterator[LocalStack]:
    st = chaos_stack(tmp_path / "chaos", CHAOS_CLUSTER_CI)
    try:
        st.start()
        yield st
    finally:
        st.stop(remove=True)


def test_chaos_on_a_cluster_keeps_every_event_exactly_once_and_in_order(chaos_cluster: LocalStack) -> None:
    report = Chaos(chaos_cluster, CHAOS_CLUSTER_CI).run()
    injected = exactly_once(report, CHAOS_CLUSTER_CI)
    assert set(CLUSTER_KINDS) <= injected <= set(KINDS + CLUSTER_KINDS), report.table()
    assert report.malformed_injected > 0 and report.duplicate_deliveries > 0, report.table()
