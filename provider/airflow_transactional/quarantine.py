"""How much of a batch may be quarantined before its commit is refused.

A record set aside is counted nowhere but the quarantine; a batch set aside *whole* is no longer a
few bad records but an upstream change (a producer that now sends a field as a number, a renamed
field): committed, it would advance the checkpoint and count nothing, for as long as nobody looks.
So a topology's ``max_quarantined`` (a share of the records a txid read, :data:`DEFAULT_SHARE` unless
declared) is a limit: a txid that read at least :data:`MIN_RECORDS` records and quarantined more
than that share is not committed -- its commit fails with the top reasons and the fix, and the
topology is blocked until the producer or the job's schema is fixed and the txid processed again
(or the limit raised). ``max_quarantined=None`` opts out, for a topology that expects it.

Reasons embed the value they refused (``field 'ts' must be text ..., got 1.76E9``); :func:`template`
is the reason without it, so that reasons group by their kind, not one per record.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .exceptions import ConfigError, QuarantineOverLimit

#: The share of a txid's records above which its commit is refused, unless declared otherwise.
DEFAULT_SHARE = 0.5
#: A txid that read fewer records is not judged: a handful of bad records in a small batch is not a trend.
MIN_RECORDS = 20
#: What a reason says after the kind of problem: the value it refused (``..., got 1.7E9``, or the quoted
#: last part of an error's message: ``ValueError: invalid literal ...: '3 EUR'``, not ``KeyError: 'amount'``).
#: The commit's query groups by the same rules (``store/queries/commits.sql``, quarantine_top_reasons).
_VALUE = ((re.compile(r"(, got |: got ).*\Z", re.S), r"\1…"),
          (re.compile(r"\A([^:]+: [^'\"]*): ['\"].*\Z", re.S), r"\1: …"))
_NOT_TEXT = re.compile(r"field '(?P<field>[^']+)' must be text \(the record schema declares it string\)")


def checked_share(topology_id: str, share: Any) -> float | None:
    """``share`` as a limit (a number above 0 and at most 1), or None (no limit); else a ConfigError."""
    if share is None:
        return None
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ConfigError(f"topology {topology_id!r}: max_quarantined must be a share of a batch's records above 0 "
                          f"and at most 1 (e.g. 0.5: refuse to commit a txid that set aside more than half its "
                          f"records), or None to never refuse; got {share!r}")
    return float(share)


def over(records: int, quarantined: int, share: float | None) -> bool:
    """Whether a txid that read ``records`` and set aside ``quarantined`` of them is over the limit."""
    return share is not None and records >= MIN_RECORDS and quarantined > share * records


#: How many of the latest committed txids the warning below looks at.
RECENT = 10


def rising(records: int, quarantined: int, share: float | None) -> str | None:
    """A warning when the latest txids set aside half their limit or more (``records`` read,
    ``quarantined`` of them): an upstream change on its way, before a txid's commit is refused."""
    if share is None or records < MIN_RECORDS or not quarantined or quarantined < share / 2 * records:
        return None
    return (f"quarantining {quarantined / records:.0%} of what its latest txids read ({quarantined:,} of "
            f"{records:,} records), past half its max_quarantined of {share:.0%}: a txid over {share:.0%} is not "
            "committed -- look at the quarantine's reasons now")


def template(reason: str) -> str:
    """``reason`` without the value it refused: what records quarantined for the same cause share."""
    for pattern, kept in _VALUE:
        reason = pattern.sub(kept, reason)
    return reason


def fix(reasons: Sequence[str]) -> str:
    """What to do about a txid whose records were quarantined for ``reasons`` (the most common first)."""
    found = _NOT_TEXT.search(reasons[0]) if reasons else None
    if found:
        field = found["field"]
        return (f"the producer sends {field!r} as something other than text: declare it in the job's schema as "
                f"what it sends (e.g. '{field} double'), or have the producer send text")
    return "fix the producer or the job (its schema, its checks) so these records are valid"


def refusal(topology_id: str, txid: int, attempt: int, records: int, quarantined: int, share: float,
            reasons: Sequence[tuple[str, int]]) -> QuarantineOverLimit:
    """The error of a txid over the limit: how much, the top reasons (template, count) and the way out."""
    top = "; ".join(f"{n:,} x {why}" for why, n in reasons) or "no reason recorded"
    return QuarantineOverLimit(
        f"topology {topology_id!r} txid {txid} attempt {attempt} quarantined {quarantined:,} of its {records:,} "
        f"records ({quarantined / records:.0%}), over its max_quarantined of {share:.0%}: not committed. Top "
        f"reasons: {top}. The fix: {fix([why for why, _n in reasons])}; then clear the run's process task to "
        f"process txid {txid} again. If this share is expected, declare max_quarantined higher (or None)")
