"""Pure parts of the sources: batch-size shares over partitions, partition routing, a correction's
events among a batch's records."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_transactional.sources.base import Versions, fair_shares
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


def test_a_corrections_events_in_one_batch_cancel_out_in_pairs_and_keep_their_origin() -> None:
    # Origin a: the original (in the batch), its retraction by correction 5, a version, the retraction of
    # that version by correction 9, and the version of 9. Origin b: a retraction of an event read before.
    versions = Versions.of([("0:1", "a", False, 0), ("0:7", "a", True, 5), ("0:8", "a", False, 5),
                            ("1:4", "b", True, 5), ("0:12", "a", False, 9), ("0:11", "a", True, 9)])
    assert versions.cancelled == {"0:1", "0:7", "0:8", "0:11"}
    assert versions.retractions == {"1:4": "b"} and versions.versions == {"0:12": "a"}
    assert versions.origin("0:12") == "a" and versions.origin("1:4") == "b" and versions.origin("0:1") is None
    # A batch starting after the original: the retraction takes back what a batch before read.
    alone = Versions.of([("0:7", "a", True, 5), ("0:8", "a", False, 5)])
    assert alone.retractions == {"0:7": "a"} and alone.versions == {"0:8": "a"} and not alone.cancelled
    assert not Versions.of([]) and Versions.of([("0:8", "a", False, 5)])
