"""Combiners and the two value rules of Storm's transactional topologies.

* transactional value ``(value, txid)``: apply a batch's delta unless the stored txid is already
  the batch's txid (then the batch was applied before and is skipped);
* opaque value ``(value, prev_value, txid)``: if the stored txid is the batch's txid, recompute
  from ``prev_value`` (the batch may have changed since); otherwise shift ``value`` into
  ``prev_value`` and combine.

A stored txid *later* than the batch's is an error: a replay behind the state must never be
applied silently. The rules exist twice: here, in Python (used to aggregate partials and by the
unit tests), and as SQL for the commit's set-based upsert (``store/state.py``); the integration
tests check the two agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .exceptions import ConfigError, ReplayBehindState


class Combiner(str, Enum):
    """How a batch's partial value folds into the stored value."""

    SUM = "sum"
    COUNT = "count"  # partials are record counts; they fold like sum
    MIN = "min"
    MAX = "max"
    REPLACE = "replace"  # the latest record (highest source offset) wins

    @classmethod
    def parse(cls, value: object) -> Combiner:
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(
                f"unknown combiner {value!r}: use one of {', '.join(c.value for c in cls)}"
            ) from None

    @property
    def numeric(self) -> bool:
        return self in (Combiner.SUM, Combiner.COUNT)


class ValueKind(str, Enum):
    """Transactional values need a transactional source; opaque values survive re-planned batches."""

    TRANSACTIONAL = "transactional"
    OPAQUE = "opaque"

    @classmethod
    def parse(cls, value: object) -> ValueKind:
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(
                f"unknown value kind {value!r}: use 'transactional' or 'opaque'"
            ) from None


def combine(combiner: Combiner, old: Any, new: Any) -> Any:
    """Fold ``new`` into ``old`` (``old`` may be None: nothing stored yet)."""
    if old is None:
        return new
    if combiner in (Combiner.SUM, Combiner.COUNT):
        return old + new
    if combiner is Combiner.MIN:
        return min(old, new)
    if combiner is Combiner.MAX:
        return max(old, new)
    return new


def aggregate(combiner: Combiner, values: Iterable[Any]) -> Any:
    """Fold a batch's values for one key, in source order, into one partial."""
    result = None
    for v in values:
        result = combine(combiner, result, v)
    return result


@dataclass(frozen=True)
class TransactionalValue:
    value: Any
    txid: int


@dataclass(frozen=True)
class OpaqueValue:
    value: Any
    prev_value: Any
    txid: int


def apply_transactional(
    stored: TransactionalValue | None, delta: Any, txid: int, combiner: Combiner
) -> TransactionalValue:
    """Storm's rule for a transactional value."""
    if stored is None:
        return TransactionalValue(delta, txid)
    if stored.txid == txid:
        return stored
    if stored.txid > txid:
        raise ReplayBehindState(f"value holds txid {stored.txid}, batch is txid {txid}")
    return TransactionalValue(combine(combiner, stored.value, delta), txid)


def apply_opaque(stored: OpaqueValue | None, delta: Any, txid: int, combiner: Combiner) -> OpaqueValue:
    """Storm's rule for an opaque value."""
    if stored is None:
        return OpaqueValue(delta, None, txid)
    if stored.txid == txid:
        return OpaqueValue(combine(combiner, stored.prev_value, delta), stored.prev_value, txid)
    if stored.txid > txid:
        raise ReplayBehindState(f"value holds txid {stored.txid}, batch is txid {txid}")
    return OpaqueValue(combine(combiner, stored.value, delta), stored.value, txid)
