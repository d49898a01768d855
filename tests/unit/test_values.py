"""The value rules of the seed, exactly: transactional (value, txid), opaque (value, prev, txid)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_transactional.exceptions import ConfigError, ReplayBehindState
from airflow_transactional.values import (
    Combiner,
    OpaqueValue,
    TransactionalValue,
    aggregate,
    apply_opaque,
    apply_transactional,
    combine,
)

pytestmark = pytest.mark.unit


def test_transactional_applies_a_new_txid_and_skips_a_replayed_one() -> None:
    v = apply_transactional(None, 5, 1, Combiner.SUM)
    assert v == TransactionalValue(5, 1)
    v = apply_transactional(v, 3, 2, Combiner.SUM)
    assert v == TransactionalValue(8, 2)
    assert apply_transactional(v, 3, 2, Combiner.SUM) == TransactionalValue(8, 2)


def test_opaque_recomputes_from_prev_when_the_same_txid_comes_again_with_another_batch() -> None:
    v = apply_opaque(None, 5, 1, Combiner.SUM)
    assert v == OpaqueValue(5, None, 1)
    v = apply_opaque(v, 3, 2, Combiner.SUM)
    assert v == OpaqueValue(8, 5, 2)
    # txid 2 replayed with a different batch (partial 10 instead of 3): count = prev + partial
    assert apply_opaque(v, 10, 2, Combiner.SUM) == OpaqueValue(15, 5, 2)


def test_opaque_first_txid_replayed_has_no_prev() -> None:
    v = apply_opaque(None, 5, 1, Combiner.SUM)
    assert apply_opaque(v, 7, 1, Combiner.SUM) == OpaqueValue(7, None, 1)


@pytest.mark.parametrize("rule", [apply_transactional, apply_opaque])
def test_a_replay_behind_the_stored_txid_is_an_error(rule) -> None:  # type: ignore[no-untyped-def]
    stored = rule(None, 1, 5, Combiner.SUM)
    with pytest.raises(ReplayBehindState):
        rule(stored, 1, 4, Combiner.SUM)


@pytest.mark.parametrize(("combiner", "values", "expected"), [
    (Combiner.SUM, [3, 4, -2], 5),
    (Combiner.COUNT, [1, 1, 1], 3),
    (Combiner.MIN, [3, 1, 2], 1),
    (Combiner.MAX, [3, 9, 2], 9),
    (Combiner.REPLACE, ["a", "b", "c"], "c"),
])
def test_aggregate(combiner: Combiner, values: list[object], expected: object) -> None:
    assert aggregate(combiner, values) == expected


def test_combine_with_nothing_stored_is_the_new_value() -> None:
    for c in Combiner:
        assert combine(c, None, 4) == 4


def test_unknown_combiner_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="use one of sum, count, min, max, replace"):
        Combiner.parse("avg")


@given(st.lists(st.lists(st.integers(-100, 100), min_size=1, max_size=5), min_size=1, max_size=8),
       st.data())
def test_opaque_equals_the_sum_of_committed_batches_whatever_the_replays(batches, data) -> None:  # type: ignore[no-untyped-def]
    """Each txid may be applied several times with different batches before the next txid;
    the value always equals the sum of the *last* batch applied for each txid."""
    v = None
    final: list[int] = []
    for txid, first in enumerate(batches, start=1):
        replays = data.draw(st.lists(st.integers(-100, 100), max_size=3))
        for partial in [sum(first), *replays]:
            v = apply_opaque(v, partial, txid, Combiner.SUM)
        final.append(([sum(first), *replays])[-1])
    assert v is not None and v.value == sum(final)
