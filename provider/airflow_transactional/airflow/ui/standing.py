"""Where a topology stands, in words, as the Transactions pages say it: its txids in flight, how
far behind its source it is, when, and what its DAG file is changing (a state being built)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .markup import e


def when(value: str | None) -> str:
    """An ISO timestamp as a person reads it, to the second, escaped."""
    if not value:
        return "-"
    stamp = datetime.fromisoformat(value)
    return e(stamp.strftime("%Y-%m-%d %H:%M:%S ") + (stamp.tzname() or ""))


def age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit} ago"
    return f"{seconds:.0f} s ago"


def flight_line(f: dict[str, Any]) -> str:
    """One txid in flight: its phase, for how long, and what Airflow holds its run for."""
    lasted = f" for {age(f['for_seconds']).removesuffix(' ago')}" if f.get("for_seconds") is not None else ""
    waiting = f" <span class=muted>&#8212; {e(f['waiting'])}</span>" if f.get("waiting") else ""
    return f"txid {int(f['txid'])}: {e(f['phase'])}{lasted}{waiting}"


def lag_text(summary: dict[str, Any]) -> str:
    """How far behind its source a topology is, in what the source counts (records, files, Kafka
    offsets), with how long the oldest has waited."""
    size = f" ({summary['lag_bytes']:,} bytes)" if summary.get("lag_bytes") is not None else ""
    return f"{summary['lag_records']:,} {e(summary.get('lag_unit') or 'records')}{size}{_waited(summary)}"


def skipped_text(summary: dict[str, Any]) -> str:
    """For a Kafka topology, the offsets its commits skipped: what a read_committed reader never sees."""
    if summary.get("lag_unit") != "offsets":
        return ""
    return (f"; {summary.get('offsets_skipped', 0):,} offsets skipped (aborted transactions' records and "
            "transaction markers: no committed record)")


def _waited(summary: dict[str, Any]) -> str:
    """How long the oldest record behind has waited, where the source knows (or why it cannot say now)."""
    if summary.get("source_error"):
        return f" (unknown now: {e(summary['source_error'])})"
    waited = summary.get("lag_seconds")
    return f" (the oldest waiting {age(waited).removesuffix(' ago')})" if summary["lag_records"] and waited else ""


def changing(summary: dict[str, Any]) -> str:
    """The states its DAG file adds, redefines or retires, and how far a build is (``core/evolution.py``)."""
    return f"<p>Changing: {e(summary['evolving'])}</p>" if summary.get("evolving") else ""
