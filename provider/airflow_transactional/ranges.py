"""What a person gives as txids: a range of committed txids (``"A..B"``, a correction's, a replay's)
and a round of the shadow audit (``"N"`` or ``"N:K"``). Each parsed here, once, wherever it is
given -- a run's conf, the correction page, ``transactional_dag(verify=...)``, the verify task, the
Spark job's arguments, the CLI -- so each refuses the same text the same way (``"10:"``, ``"10:0"``,
a 5,000-digit txid) instead of each reading it its own way, or failing with a traceback."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from .exceptions import ConfigError

#: The largest txid or record id the state store holds (bigint).
MAX_ID = 2**63 - 1
_TXID_RANGE = re.compile(r"\s*([0-9]{1,19})\s*(?:(?:\.\.|-)\s*([0-9]{1,19})\s*)?")


def txid_range(given: Any) -> tuple[int, int]:
    """``"A..B"``, ``"A"``, ``[A, B]`` or ``{"txids": [A, B]}`` as (A, B): txids from 1 to :data:`MAX_ID`."""
    if isinstance(given, Mapping):
        given = given.get("txids")
    pair: tuple[int, int] | None = None
    if isinstance(given, str) and (found := _TXID_RANGE.fullmatch(given)):
        pair = int(found[1]), int(found[2] or found[1])
    elif isinstance(given, Sequence) and len(given) == 2 and all(type(t) is int for t in given):
        pair = int(given[0]), int(given[1])
    if pair is None or not all(1 <= t <= MAX_ID for t in pair):
        raise ConfigError(f"a correction names committed txids as 'A..B' (or 'A', or [A, B]), each a whole number "
                          f"from 1 to {MAX_ID:,}; got {shown(given)}")
    return pair


def shown(given: Any, most: int = 60) -> str:
    """``repr(given)``, cut to ``most`` characters with how long it was: an error quotes what it was given."""
    text = repr(given)
    return text if len(text) <= most else f"{text[:most]}... ({len(text):,} characters)"


#: At most this many txids a round, 1 in at most this many: far past any real round, and a number
#: every caller can hold.
MOST = 1_000_000_000
_ROUND = re.compile(r"([1-9][0-9]{0,9})(?::([1-9][0-9]{0,9}))?")


class Round(NamedTuple):
    """Up to ``budget`` txids checked a round, 1 in ``every`` of them recomputed."""

    budget: int
    every: int = 1

    @classmethod
    def parse(cls, given: Any, what: str = "the round") -> Round:
        """``given`` (``"N"`` or ``"N:K"``, whole numbers from 1) as a Round, else a ConfigError that says
        ``what`` it was given as and how to write one."""
        found = _ROUND.fullmatch(given) if isinstance(given, str) else None
        if found is None or max(int(found[1]), int(found[2] or 1)) > MOST:
            raise ConfigError(f"{what} is a round of the shadow audit, \"N\" or \"N:K\" (up to N committed txids, 1 "
                              f"in K of them, each a whole number from 1 to {MOST:,}; e.g. \"10\" or \"10:5\"), "
                              f"got {shown(given)}")
        return cls(int(found[1]), int(found[2] or 1))

    def __str__(self) -> str:
        return str(self.budget) if self.every == 1 else f"{self.budget}:{self.every}"
