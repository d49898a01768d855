"""What the Transactions pages show of the shadow audit (``core/verify.py``): a committed txid's
check in a word (the timeline's column) and in full (its run page: why, and the states and keys
that differ), and the topology's verified-through mark with its failed checks."""

from __future__ import annotations

from typing import Any

from .markup import e, plural, table


def check_cell(c: dict[str, Any] | None) -> str:
    """A committed txid's check by the shadow audit, in a word (failed in red)."""
    status = ((c or {}).get("check") or {}).get("status")
    if status is None:
        return "-"
    return f"<span class=blocked>{e(status)}</span>" if status == "failed" else e(status)


def check(c: dict[str, Any]) -> str:
    """What the shadow audit found of a committed txid: its status, why, and what differs."""
    found = c.get("check") or {}
    status, detail = found.get("status", "pending"), found.get("detail") or {}
    if status == "pending":
        return "<p class=muted>Check: pending (no round of the shadow audit has reached it).</p>"
    kind = str(detail.get("kind") or "")
    why = detail.get("reason") or {
        ("range", "verified"): "its range recomputed is what the range and its corrections applied",
        ("batch", "verified"): "recomputed from its source, the same deltas",
        ("range", "failed"): "its range recomputed is not what the range and its corrections applied",
        ("batch", "failed"): "recomputed from its source, other deltas"}.get((kind, status), "")
    head = (f"<p class={'blocked' if status == 'failed' else 'ok' if status == 'verified' else 'muted'}>"
            f"Check: <b>{e(status)}</b>{': ' + e(why) if why else ''}.</p>")
    differs = {**detail.get("differences", {}), **detail.get("states", {})}
    rows = [[e(name), e(sample.get("key")), e(sample.get("committed", sample.get("stored"))),
             e(sample.get("recomputed", sample.get("history")))]
            for name, d in sorted(differs.items()) if isinstance(d, dict) for sample in d.get("samples", [])]
    rows += [[e(name), "-", e(d.get("committed")), e(d.get("recomputed"))] for name, d in sorted(differs.items())
             if isinstance(d, dict) and not d.get("samples")]
    if not rows:
        return head
    recomputed = "from the history" if detail.get("states") else "recomputed"
    return head + table(["state", "key", "committed" if not detail.get("states") else "stored", recomputed], rows)


def verified(base: str, summary: dict[str, Any]) -> str:
    """The shadow audit's mark and its failed checks (nothing when it never ran)."""
    if summary.get("verified_through") is None:
        return ""
    failed = summary.get("verification_failures") or []
    line = (f"<p>Verified through txid <b>{int(summary['verified_through'])}</b> of {summary['committed_txid']} "
            "committed (each recomputed from its source and checked against its commit).</p>")
    if failed:
        line += (f"<p class=blocked>{plural(len(failed), 'committed txid')} failed the check: "
                 + ", ".join(str(int(t)) for t in failed) + " -- their run pages say which states and keys differ; "
                 f"<code>airflow-txn verify {e(summary['topology_id'])} --status</code>.</p>")
    return line
