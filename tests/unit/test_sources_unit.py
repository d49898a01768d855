"""Pure parts of the sources: batch-size shares over partitions, partition routing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_transactional.sources.base import fair_shares
from airflow_transactional.sources.pglog import partition_of

pytestmark = pytest.mark.unit


def test_fair_shares_split_evenly_then_give_leftovers_to_the_fuller() -> None:
    assert fair_shares({0: 100, 1: 100, 2: 100}, 30) == {0: 10, 1: 10, 2: 10}
    assert fair_shares({0: 2, 1: 100, 2: 100}, 30) == {0: 2, 1: 14, 2: 14}
    assert fair_shares({0: 0, 1: 5}, 30) == {0: 0, 1: 5}


@given(st.dictionaries(st.integers(0, 15), st.integers(0, 1000), min_size=1), st.integers(1, 5000))
def test_fair_shares_never_exceed_the_cap_or_what_is_there(avail: dict[int, int], cap: int) -> None:
    take = fair_shares(avail, cap)
    assert all(0 <= take[p] <= avail[p] for p in avail)
    assert sum(take.values()) == min(cap, sum(avail.values()))


def test_partition_routing_is_stable_across_processes_and_releases() -> None:
    # Producers in other processes (other hash seeds) and other releases must route an id to the
    # same partition: the values are CRC-32 of the id, pinned here.
    assert [partition_of(f"event-{i}", 8) for i in (1, 2, 42)] == [4, 6, 5]
    other = subprocess.run([sys.executable, "-c", "from airflow_transactional.sources.pglog import partition_of; "
                            "print(partition_of('event-42', 8))"], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert other.stdout.strip() == "5"
    assert {partition_of(f"e{i}", 4) for i in range(100)} == {0, 1, 2, 3}
