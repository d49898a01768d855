"""Hostile records, and what a batch of them must come to: shared by the pure-Python processor's
property test (integration) and the Spark helper's (spark).

A record is a tweet-like JSON object ``{"user": ..., "amount": ...}`` -- or not an object, or not
JSON at all. The generator mixes plain ones with what a careless or hostile producer appends: a
key past the index row limit, a NUL inside a key, numbers a bigint cannot hold (or holds only
until they are summed), NaN and infinities, text where a number goes, nesting deep enough to
break a recursive parser, escaped lone surrogates (``\\ud800``: no UTF-8 text holds one) beside
escaped pairs and escaped backslashes that are fine. :func:`oracle` says, independently of the
processors, which records a batch must count and what the states must hold.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

BIGINT = 2**63 - 1
USERS = ["ann", "bob", "cy", "d\u00e9d\u00e9", "e v e"]
#: Text json.dumps escapes: lone halves (bad), a pair given as halves or as the character (one
#: emoji: fine), a backslash before "ud800" (no escape of a surrogate: fine).
SURROGATES = ["\ud800", "a\udfff", "\udc00\ud800", "\ud83d\ude00", "\U0001f600", "\\ud800", "\\\ud800"]

#: What a value may be: plain numbers most of the time, and every kind of trouble.
AMOUNTS = st.one_of(
    st.integers(-1000, 1000), st.integers(-1000, 1000), st.integers(-1000, 1000),
    st.sampled_from([BIGINT - 2, -BIGINT, BIGINT + 1, 10**30, 1e308, -1e308, float("nan"), float("inf"),
                     float("-inf"), 2.5, "12", "lots", None, True, [1, 2], {"n": 1}]),
)
KEYS = st.one_of(
    st.sampled_from(USERS), st.sampled_from(USERS),
    st.sampled_from(["k\u0000ey", "x" * 3000, "\u00e9" * 600, "", 17, None, ["a"], {"u": 1}]),
    # Not text, and text that reads like such a value: a record schema's string field tells them apart.
    st.sampled_from([1.5, 1e308, -0.0, float("nan"), float("-inf"), True, False, 10**40, -7,
                     "1.5", "true", "NaN", "[1]", "{}", "-7"]),
    st.sampled_from(SURROGATES),
)


@st.composite
def payloads(draw: st.DrawFn) -> str:
    """One record's raw text."""
    kind = draw(st.sampled_from(["plain"] * 8 + ["deep", "garbage", "array", "no_user", "note"]))
    if kind == "deep":
        depth = draw(st.sampled_from([70, 5_000, 100_000]))  # both processors agree below 512 and above 1,000
        return '{"user": "ann", "amount": 1, "x": ' + "[" * depth + "]" * depth + "}"
    if kind == "garbage":
        return draw(st.sampled_from(["{not json", "", "nul\\u0000", '"just a string"', "12"]))
    if kind == "array":
        return json.dumps([{"user": "ann", "amount": 1}])
    record: dict[str, Any] = {"amount": draw(AMOUNTS)}
    if kind == "plain":
        record["user"] = draw(KEYS)
    if kind == "note":  # a field no state reads: a lone surrogate there still makes the record bad
        record.update(user=draw(st.sampled_from(USERS)), note=draw(st.sampled_from(SURROGATES)))
    return json.dumps(record)


BATCHES = st.lists(payloads(), min_size=1, max_size=40)

#: Batches every run tries, whatever Hypothesis draws: the second review's own cases.
EXAMPLES = [
    [json.dumps({"user": "ann", "amount": 2**63 - 2}), json.dumps({"user": "ann", "amount": 5}),
     json.dumps({"user": "bob", "amount": 1})],  # a sum past a bigint (ARITHMETIC_OVERFLOW in Spark)
    [json.dumps({"user": "x" * 6000, "amount": 1}), json.dumps({"user": "k\u0000ey", "amount": 1}),
     json.dumps({"user": "ann", "amount": 1})],  # past the index row limit; a NUL in a key
    [json.dumps({"user": "ann", "amount": a}) for a in (1e308, float("nan"), float("inf"), 10**30, "lots")]
    + [json.dumps({"user": "cy", "amount": 2})],
    ['{"user": "ann", "amount": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "{not json", "[1]"],
    [json.dumps({"user": u, "amount": 1}) for u in SURROGATES]
    + [json.dumps({"user": "ann", "amount": 1, "note": "\udfff"})],  # the third review's lone surrogates
    [json.dumps({"user": u, "amount": 1}) for u in (1e308, float("nan"), True, [1, 2], {"a": 1}, 2.5, -0.0, 1.0,
                                                    10**40, -7, "1.0E308", "NaN", "true", "[1,2]", "2.5")]
    + ['{"user": 1.0E308, "amount": 1}', '{"user": NaN, "amount": 2}', '{"user": "1.5", "amount": 3, "x": NaN}'],
    # one key as a number and as its digits: a text key holds both as "-7", and a batch folds them together
    [json.dumps({"user": u, "amount": 1}) for u in (-7, "-7", 12, "12", "-7")],
]


def _key(user: Any) -> str | None:
    """The text a record's user becomes as a key, or None when it cannot be one: text, or a whole
    number as its digits (both processors alike). Without NUL, at most 1,024 bytes."""
    if isinstance(user, str) or type(user) is int:
        text = str(user)
    else:
        return None
    return text if "\x00" not in text and len(text.encode()) <= 1024 else None


def oracle(batch: Sequence[str], *, spark: bool = False) -> tuple[dict[str, int], dict[str, int], list[int]]:
    """(count per user, sum per user, positions of the records to quarantine), in log order.

    A record counts when it is a JSON object nesting no deeper than the processor's limit (512 for
    the pure-Python one, Spark's reader's 1,000), with a user that is a key (:func:`_key`) and an
    amount that is a whole number a bigint holds. The pure-Python processor quarantines the record
    that would carry its user's sum out of a bigint's range; the Spark helper, which folds before
    it can tell, sets the user's sum of the batch aside (it stays out of the sums, its records
    counted)."""
    counts: dict[str, int] = {}
    sums: dict[str, int] = {}
    bad: list[int] = []
    for n, text in enumerate(batch):
        try:
            record = json.loads(text) if _depth(text) <= (1000 if spark else 512) else None
        except ValueError:
            record = None
        user = _key(record.get("user")) if isinstance(record, dict) and _utf8(record) else None
        if user is None or not _amount_ok(record.get("amount")):  # type: ignore[union-attr]
            bad.append(n)
            continue
        amount = record["amount"]  # type: ignore[index]
        if not spark and not -(2**63) <= sums.get(user, 0) + amount <= BIGINT:
            bad.append(n)
            continue
        counts[user] = counts.get(user, 0) + 1
        sums[user] = sums.get(user, 0) + amount
    if spark:
        sums = {user: total for user, total in sums.items() if -(2**63) <= total <= BIGINT}
    return counts, sums, bad


def _utf8(record: Any) -> bool:
    """Whether every text the parsed record holds is UTF-8 (no lone surrogate)."""
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _amount_ok(amount: Any) -> bool:
    return type(amount) is int and -(2**63) <= amount <= BIGINT


def _depth(text: str) -> int:
    """How deep ``text`` nests (brackets outside strings); a simple reference count."""
    deepest = depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def counting_fn(record: dict[str, Any]) -> list[tuple[str, tuple[Any, ...], Any]]:
    """The pure-Python processor's transform: a count and a bigint sum per user."""
    return [("hostile_count", (record["user"],), 1), ("hostile_amount", (record["user"],), record["amount"])]
