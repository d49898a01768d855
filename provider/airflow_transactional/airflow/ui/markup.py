"""The smallest parts of the Transactions pages' HTML: escaped text, a table, a counted noun."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any


def e(value: Any) -> str:
    """Escaped text of any value (None: a dash)."""
    return "-" if value is None else html.escape(str(value), quote=True)


def table(head: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Sequence[int] = ()) -> str:
    """A table of already escaped cells; ``numeric`` columns are right-aligned."""
    th = "".join(f"<th>{e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td{' class=n' if i in numeric else ''}>{c}</td>" for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, in the plural unless one ("1 failed try", "2 tries")."""
    many = word[:-1] + "ies" if word.endswith("y") and word[-2:-1] not in "aeiou" else word + "s"
    return f"{n:,} {word if n == 1 else many}"
