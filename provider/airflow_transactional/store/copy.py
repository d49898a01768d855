"""COPY's text and CSV formats, written once: how one value becomes one field of a ``COPY ... FROM
STDIN`` line."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any


def copy_field(value: Any) -> str:
    """One field: ``\\N`` for NULL, timestamps in ISO form, backslash, tab and newlines escaped."""
    if value is None:
        return "\\N"
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def copy_line(values: Iterable[Any]) -> str:
    """One line of COPY text for a row."""
    return "\t".join(map(copy_field, values)) + "\n"


def csv_field(value: Any) -> str:
    """One field of COPY's CSV format: empty for NULL, text always quoted (an empty text is not
    NULL), booleans as ``true``/``false``, numbers as they print."""
    if value is None:
        return ""
    if isinstance(value, str):
        return '"' + value.replace('"', '""') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return value.isoformat() if isinstance(value, datetime) else str(value)


def csv_line(values: Iterable[Any]) -> str:
    """One line of COPY's CSV format for a row."""
    return ",".join(map(csv_field, values)) + "\n"
