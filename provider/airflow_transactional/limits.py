"""What one record may carry: the limits every processor checks before anything is staged.

A record that breaks one is quarantined with the reason; it never reaches a staging table, where
it would fail every attempt of its batch (a key past Postgres' index row limit, a NUL byte, a
value its column cannot hold) and so stop the topology. The limits are well inside what
PostgreSQL and Spark can hold, so a record that passes them cannot fail a COPY or a fold:

* a key (all the text of a state's key columns together) and an id (an event's, a request's,
  an output event's) are at most :data:`MAX_KEY_BYTES` / :data:`MAX_ID_BYTES` bytes of UTF-8 --
  a B-tree entry holds about 2,700 -- and hold no NUL (PostgreSQL text cannot);
* a value fits its state's value type (:func:`value_range`): an integer in ``bigint`` or
  ``integer`` range, a ``numeric`` within what Spark's ``decimal(38,10)`` holds, a finite
  ``double precision`` (never NaN or infinite);
* a JSON record nests at most :data:`MAX_NESTING` levels deep (the pure-Python processor; Spark's
  JSON reader holds to its own limit, 1,000 levels, and a record past it is malformed);
* a record is at most :data:`MAX_RECORD_BYTES` bytes (UTF-8): the event log refuses a longer
  payload at append, and a longer record from a source the provider does not write (a Kafka
  topic, a landing file's line) is quarantined, its first characters kept;
* a JSON record's text is UTF-8: an escaped lone surrogate (``"\\ud800"`` with no low half after
  it) decodes to no character UTF-8 can hold -- PostgreSQL refuses it, Spark would store ``?`` --
  so the record is quarantined by both processors alike (:data:`SURROGATE_PAIRS_AND_BACKSLASHES`).

A sum that leaves its type's range only once several records add up is not one record's fault:
the Python processor sets aside the record that would carry its key's sum out of range, the
Spark helper the key's rows of that batch (the records cannot be told apart after a fold), and
the commit the key's delta when the committed value plus the delta would leave it. Each says so
in the quarantine; declare ``value_type="numeric"`` for sums that large.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

#: The most bytes (UTF-8) the text of one key may have, all of a state's key columns together.
MAX_KEY_BYTES = 1024
#: The most bytes (UTF-8) of an event id, a request id or an output event's id.
MAX_ID_BYTES = 512
#: How deep a JSON record may nest (objects and arrays).
MAX_NESTING = 512
#: The most bytes (UTF-8) of one record: Kafka's default largest message (``message.max.bytes``).
MAX_RECORD_BYTES = 1 << 20
#: The largest landed file a plan reads through (local or on a store): a larger one is known by its
#: stat or its store's version alone (no digest: touched, it is a new version) and read as text, each
#: line judged, by Spark -- a plan never reads gigabytes before planning.
SCAN_MAX_BYTES = 256 << 20
#: How much of a bad record's raw text the quarantine keeps (its full length is kept beside it).
QUARANTINE_RECORD_CHARS = 4096

#: What a JSON text's escapes hold that is not a lone surrogate: an escaped backslash, and a high
#: surrogate's escape followed by a low one's (a pair: one character). Removed, left to right
#: (``re.sub``; Spark's ``regexp_replace``, the same Java-compatible pattern), what is left of
#: :data:`SURROGATE_ESCAPE` is an escape of a lone half -- exactly what a JSON parser would decode
#: to a lone surrogate, a backslash's parity taken into account.
SURROGATE_PAIRS_AND_BACKSLASHES = r"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
#: The escape of a surrogate half (high or low).
SURROGATE_ESCAPE = r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
#: Why a record over :data:`MAX_RECORD_BYTES` is refused (a reader may hold only its start).
RECORD_TOO_LARGE = f"the record is more than the {MAX_RECORD_BYTES:,} bytes allowed (UTF-8)"
#: Why a record holding an escaped lone surrogate is refused.
LONE_SURROGATE = ("the record holds an escaped lone surrogate (\\ud800-\\udfff without its other half): no "
                  "UTF-8 text can hold it")
_PAIRS = re.compile(SURROGATE_PAIRS_AND_BACKSLASHES)
_SURROGATE = re.compile(SURROGATE_ESCAPE)

#: The values each numeric value type holds (inclusive). ``numeric`` is bounded by what Spark
#: folds it as (``decimal(38,10)``: 28 digits before the point).
_RANGES: dict[str, tuple[int | float | Decimal, int | float | Decimal]] = {
    "bigint": (-(2**63), 2**63 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "numeric": (Decimal("-9999999999999999999999999999.9999999999"),
                Decimal("9999999999999999999999999999.9999999999")),
    "double precision": (-1.7976931348623157e308, 1.7976931348623157e308),
}
INTEGER_TYPES = frozenset({"bigint", "integer"})


def value_range(value_type: str) -> tuple[Any, Any]:
    """(lowest, highest) value a state of ``value_type`` may hold (no bound for non-numeric types)."""
    return _RANGES.get(value_type, (-math.inf, math.inf))


def nul_or_too_long(text: str, limit: int) -> str | None:
    """Why ``text`` cannot be a key or an id (None: it can)."""
    if "\x00" in text:
        return "holds a NUL byte (\\u0000), which PostgreSQL text cannot store"
    if len(text) * 4 > limit:  # most characters take fewer bytes: encode only what may be too long
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limit:
            return f"is {size:,} bytes long, more than the {limit:,} allowed"
    return None


def key_refusal(state: str, key_types: Sequence[str], key: Sequence[Any]) -> str | None:
    """Why ``key`` (one value per key column, of ``key_types``) cannot be a key of ``state``."""
    if any(k is None for k in key):
        return f"null key for state {state!r}"
    for sql_type, k in zip(key_types, key, strict=True):
        why = field_refusal(f"the key of state {state!r}", sql_type, k)
        if why is not None:
            return why
    texts = [str(k) for k, t in zip(key, key_types, strict=True) if t == "text"]
    if sum(len(k) for k in texts) * 4 > MAX_KEY_BYTES:
        size = sum(len(k.encode("utf-8", "surrogatepass")) for k in texts)
        if size > MAX_KEY_BYTES:
            return f"the key of state {state!r} is {size:,} bytes long, more than the {MAX_KEY_BYTES:,} allowed"
    return None


def id_refusal(what: str, ident: Any) -> str | None:
    """Why ``ident`` cannot be ``what`` (an event id, a request id ...; None: it can)."""
    if not isinstance(ident, str) or not ident:
        return f"{what} must be non-empty text, got {_short(ident)}"
    why = nul_or_too_long(ident, MAX_ID_BYTES)
    return None if why is None else f"{what} {why}"


def value_refusal(state: str, value_type: str, value: Any) -> str | None:
    """Why ``value`` cannot be a value of a ``value_type`` state (None: it can)."""
    if value is None:
        return f"the value for state {state!r} is null"
    return field_refusal(f"the value for state {state!r}", value_type, value)


def field_refusal(what: str, sql_type: str, value: Any) -> str | None:
    """Why ``value`` cannot go into a column of ``sql_type`` (None: it can). ``what`` names it."""
    if sql_type in _RANGES:
        return _number_refusal(what, sql_type, value)
    if sql_type == "text":
        if isinstance(value, bool) or not isinstance(value, (str, int)):  # a whole number reads as its digits
            return f"{what} must be text, got {_short(value)}"
        text = str(value)
        return f"{what} holds a NUL byte (\\u0000), which PostgreSQL text cannot store" if "\x00" in text else None
    if sql_type == "boolean":
        return None if isinstance(value, bool) else f"{what} must be true or false, got {_short(value)}"
    if sql_type in ("date", "timestamp with time zone"):
        kind = date if sql_type == "date" else datetime
        if isinstance(value, kind):
            return None
        try:
            kind.fromisoformat(value)
        except (TypeError, ValueError):
            return f"{what} must be an ISO {'date' if kind is date else 'timestamp'}, got {_short(value)}"
    return None


def _number_refusal(what: str, sql_type: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        return f"{what} must be a number ({sql_type}), got {_short(value)}"
    if (isinstance(value, float) and not math.isfinite(value)) or (
            isinstance(value, Decimal) and not value.is_finite()):
        return f"{what} is {value}, not a finite number"
    if sql_type in INTEGER_TYPES and value != int(value):
        return f"{what} must be a whole number ({sql_type}), got {_short(value)}"
    low, high = _RANGES[sql_type]
    try:
        inside = low <= value <= high
    except (InvalidOperation, OverflowError):
        inside = False
    if not inside:
        return f"{what} ({_short(value)}) does not fit {sql_type} ({low:g} to {high:g})"
    return None


def as_stored(sql_type: str, value: Any) -> Any:
    """``value`` (one that passed :func:`field_refusal`) as its column takes it and sums it: a whole
    number for an integer column (COPY refuses ``2.0`` for a bigint), a Decimal for ``numeric``
    (exact, and never mixed with floats), a float for ``double precision``, its digits for a whole
    number in a ``text`` column (so ``-7`` and ``"-7"`` are one key, as the column holds them)."""
    if sql_type == "text" and type(value) is int:
        return str(value)
    if sql_type in INTEGER_TYPES:
        return int(value)
    if sql_type == "numeric" and not isinstance(value, Decimal):
        return Decimal(str(value))
    if sql_type == "double precision":
        return float(value)
    return value


def printable(text: str) -> str:
    """``text`` as PostgreSQL text can hold it: a NUL byte becomes U+FFFD (the quarantine keeps a
    bad record's text even when its badness is a NUL)."""
    return text.replace("\x00", "\ufffd")


def too_large(size: int) -> str:
    """Why a record of ``size`` bytes is refused at append."""
    return f"the record is {size:,} bytes long, more than the {MAX_RECORD_BYTES:,} allowed"


def record_refusal(payload: str) -> str | None:
    """Why the raw record ``payload`` cannot be processed, whatever it holds (None: it can): more
    than :data:`MAX_RECORD_BYTES`, or JSON text escaping a lone surrogate. Cheap for most
    records: a length and a substring test."""
    if len(payload) * 4 > MAX_RECORD_BYTES:  # most characters take fewer bytes: encode only what may be too long
        size = len(payload) if len(payload) > MAX_RECORD_BYTES else len(payload.encode("utf-8", "surrogatepass"))
        if size > MAX_RECORD_BYTES:
            return RECORD_TOO_LARGE
    return LONE_SURROGATE if escapes_lone_surrogate(payload) else None


def edit_refusal(text: str) -> str | None:
    """Why ``text`` cannot be a quarantined record's edit (None: it can): it would fail its insert
    (a NUL, a lone surrogate) or be quarantined again by the replay that reads it -- said now, to
    the person editing, not one replay later."""
    if "\x00" in text:
        return "the record holds a NUL byte (\\u0000), which PostgreSQL text cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "the record holds a lone surrogate (U+D800-U+DFFF without its other half): no UTF-8 text can hold it"
    return record_refusal(text) or nesting_refusal(text)


def escapes_lone_surrogate(text: str) -> bool:
    """Whether JSON ``text`` escapes a lone surrogate (:data:`SURROGATE_PAIRS_AND_BACKSLASHES`);
    looked at only when it holds ``\\u`` at all."""
    return "\\u" in text and _SURROGATE.search(_PAIRS.sub("", text)) is not None


def nesting_refusal(text: str) -> str | None:
    """Why the JSON ``text`` nests too deep to be parsed safely (None: it does not), counting the
    brackets outside strings up to :data:`MAX_NESTING` (cheap: most records never get deep)."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return None
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return f"the record nests deeper than {MAX_NESTING} levels"
        elif ch in "]}":
            depth -= 1
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text):,} characters)"
