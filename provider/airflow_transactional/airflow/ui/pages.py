"""The HTML of the Transactions pages: server-rendered, no script, every untrusted string (record
payloads, reasons, error text, run ids) escaped. Shown by the Airflow UI in its frame."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from ...model import offsets_moved
from .checks import check, check_cell, verified
from .markup import e, plural, table
from .standing import age, changing, flight_line, lag_text, skipped_text, when
from .waits import TASK_ORDER

#: How much of a quarantined record a page shows (the CSV download has all of it).
RECORD_CHARS = 200

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:16px;color:#1a202c;background:#fff}
h1{font-size:20px;margin:0 0 12px}h2{font-size:16px;margin:20px 0 8px}
table{border-collapse:collapse;margin:4px 0 12px}th,td{border-bottom:1px solid #e2e8f0;padding:4px 10px;
text-align:left;vertical-align:top}th{background:#f7fafc;font-weight:600}td.n{text-align:right;
font-variant-numeric:tabular-nums}.blocked{color:#c53030;font-weight:600}.ok{color:#2f855a}
.muted{color:#718096}code,pre{font:12px ui-monospace,monospace}pre{white-space:pre-wrap;word-break:break-all;
margin:0;max-width:640px}.bar-plan{fill:#a0aec0}.bar-ok{fill:#48bb78}.bar-failed{fill:#e53e3e}
.bar-run{fill:#ecc94b}.bar-commit{fill:#3182ce}.bar-old{fill:#cbd5e0}form{margin:8px 0}
a{color:#2b6cb0}a.action{font-weight:600}button.confirm{font:inherit;padding:6px 14px;background:#2b6cb0;color:#fff;
border:0;border-radius:4px;cursor:pointer}
"""


def page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{e(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


def counts(row_counts: dict[str, int] | None) -> str:
    return ", ".join(f"{e(k)}: {int(v):,}" for k, v in sorted((row_counts or {}).items())) or "-"


def committed(c: dict[str, Any]) -> str:
    """What a commit changed: rows per state, events appended per output, verdicts per decision
    (not the rows it staged: a decision's output stages an event for each verdict it could get)."""
    parts = [f"{e(k)}: {int(v):,}" for k, v in sorted(c["rows"].items())]
    parts += [f"{e(o)}: {int(n):,} events appended" for o, n in sorted((c.get("appended") or {}).items())]
    parts += [f"{e(d)}: {int(v['granted']):,} granted, {int(v['declined']):,} declined"
              for d, v in sorted((c.get("decided") or {}).items())]
    return ", ".join(parts) or "-"


def corrects(t: dict[str, Any]) -> str:
    """`` (corrects 3..7)`` after a correction's run id."""
    txids = (t.get("corrects") or {}).get("txids")
    return f" <b>(corrects {int(txids[0])}..{int(txids[1])})</b>" if txids else ""


def provenance(c: dict[str, Any]) -> str:
    """What produced a commit (its code's digests, the DAG version) and what it applied (per state)."""
    code = c.get("code") or {}
    parts = [f"{e(k.replace('_', ' '))} <code>{e(str(code[k])[:16])}</code>"
             for k in ("application", "provider", "declaration", "dag_version") if code.get(k)]
    digests = ", ".join(f"{e(k)} <code>{e(v)}</code>" for k, v in sorted((c.get("digests") or {}).items()))
    return ((f"<p class=muted>Code: {'; '.join(parts)}.</p>" if parts else "")
            + (f"<p class=muted>Digests of what it applied (count:hash): a state's deltas; as out:name, the "
               "events its attempt staged for an output -- a decision's output stages one for each verdict it "
               f"could give, so the count may pass the events appended: {digests}.</p>" if digests else ""))


def spans(start: dict[str, Any], end: dict[str, Any]) -> str:
    """A batch's offsets as a person reads them: ``start -> end`` per partition that moved."""
    moved = [f"partition {e(k)}: {e(a)} &#8594; {e(b)}" for k, a, b in offsets_moved(start, end)]
    return ", ".join(moved) or "nothing new"


#: Where the plugin is mounted in the api-server (app.py), beside Airflow's own UI.
PLUGIN_PREFIX = "/transactional"


def dag_path(dag_id: str) -> str:
    return f"/dags/{quote(dag_id, safe='')}"


def run_path(dag_id: str, run_id: str) -> str:
    return f"{dag_path(dag_id)}/runs/{quote(run_id, safe='')}"


def transactions(base: str, topologies: list[dict[str, Any]]) -> str:
    """The Transactions page: every topology the user may see."""
    rows = []
    for t in topologies:
        flight = "<br>".join(flight_line(f) for f in t["in_flight"]) or "none"
        blocked = (f"<span class=blocked>{e(t['blocked_by'])}</span>" if t["blocked_by"]
                   else f"<span class=blocked>{e(t['quarantine_warning'])}</span>" if t.get("quarantine_warning")
                   else "<span class=ok>nothing</span>")
        rows.append([f"<a href='{e(base)}/dags/{quote(t['dag_id'], safe='')}'>{e(t['topology_id'])}</a>",
                     str(t["committed_txid"]), flight, lag_text(t), when(t["last_commit_at"]),
                     age(t["last_commit_age_seconds"]), f"{t['commits_per_minute']:.1f}",
                     f"{t['quarantined']:,}" + (f" (+{t['quarantined_pending']:,} pending)"
                                                if t["quarantined_pending"] else ""), blocked])
    body = ("<h1>Transactions</h1>"
            "<p class=muted>Every transactional topology you may see: what has committed, what is in flight "
            "and in which phase, how far behind the source it is, and what (if anything) blocks it.</p>")
    if not rows:
        return page("Transactions", body + "<p>No transactional topology you can see has run yet.</p>")
    return page("Transactions", body + table(
        ["topology", "committed txid", "in flight", "lag", "last commit", "age", "commits/min",
         "quarantined", "blocked by"], rows, numeric=(1, 3, 6, 7)))


def _bars(txns: list[dict[str, Any]], now: datetime) -> str:
    """One row per txid (oldest at the top): plan, each attempt and the commit on one time axis."""
    def ts(value: str | None) -> float | None:
        return datetime.fromisoformat(value).timestamp() if value else None

    spans: list[tuple[int, float, float, str, str]] = []  # (row, start, end, css class, title)
    ordered = sorted(txns, key=lambda t: t["txid"])
    for row, t in enumerate(ordered):
        planned = ts(t["planned_at"]) or now.timestamp()
        starts = [ts(a["started_at"]) for a in t["attempts"]]
        first = min([s for s in starts if s is not None], default=None)
        commit = t["commit"]
        plan_end = first or (ts(commit["started_at"]) if commit else None) or planned
        failed_early = tries_before_attempts(t)
        if failed_early:  # tries killed before they began an attempt: the plan's row says so, in red
            spans.append((row, planned, max(plan_end, planned + 1), "bar-failed",
                          f"txid {t['txid']}: {plural(failed_early, 'try')} failed before processing began: "
                          f"{t.get('last_try_failure') or t.get('failure') or 'see the run'}"))
        else:
            spans.append((row, planned, max(plan_end, planned), "bar-plan", f"txid {t['txid']}: planned"))
        for a in t["attempts"]:
            start = ts(a["started_at"]) or planned
            end = ts(a["finished_at"]) or now.timestamp()
            css = {"complete": "bar-ok", "committed": "bar-ok", "failed": "bar-failed", "running": "bar-run"}.get(
                a["status"], "bar-old")
            spans.append((row, start, end, css, f"txid {t['txid']} attempt {a['attempt']}: {a['status']}"))
        if commit:
            spans.append((row, ts(commit["started_at"]) or planned, ts(commit["committed_at"]) or planned,
                          "bar-commit", f"txid {t['txid']}: committed (attempt {commit['attempt']})"))
    if not spans:
        return ""
    lo, hi = min(s[1] for s in spans), max(s[2] for s in spans)
    width, label, height = 900, 70, 18
    scale = (width - label - 10) / max(hi - lo, 1.0)
    parts = [f"<svg width={width} height={len(ordered) * height + 24} role=img aria-label='timeline'>"]
    for row, t in enumerate(ordered):
        parts.append(f"<text x=0 y={row * height + 13} font-size=12>txid {t['txid']}</text>")
    for row, start, end, css, title in spans:
        x = label + (start - lo) * scale
        parts.append(f"<rect class={css} x={x:.1f} y={row * height + 3} width={max((end - start) * scale, 2):.1f} "
                     f"height={height - 6}><title>{e(title)}</title></rect>")
    parts.append(f"<text x={label} y={len(ordered) * height + 18} font-size=11 class=muted>"
                 f"{e(datetime.fromtimestamp(lo).astimezone().isoformat(timespec='seconds'))} &#8594; "
                 f"{hi - lo:.0f} s</text></svg>")
    return "".join(parts)


def tries_before_attempts(t: dict[str, Any]) -> int:
    """How many failed tries of txid ``t`` never began a processing attempt (a task killed before,
    a launcher that failed): the attempts do not tell them."""
    failed_attempts = sum(1 for a in t["attempts"] if a["status"] == "failed")
    return max(0, int(t.get("failed_tries") or 0) - failed_attempts)


def txn_status(t: dict[str, Any]) -> str:
    """A txid's state in one word or two, as its attempts and failed tries tell it: committed, failed
    (for good, or its last try), processing, processed, or planned."""
    if t["commit"] or t["status"] == "committed":
        return "committed"
    if t.get("failure"):
        return "failed for good"
    latest = max(t["attempts"], key=lambda a: a["attempt"], default=None)
    if latest is not None and latest["status"] == "running":
        return "processing"
    if latest is not None and latest["status"] == "complete":
        return "processed"
    if (latest is not None and latest["status"] == "failed") or t.get("failed_tries"):
        return "failed"
    return "planned"


def _blocked(base: str, summary: dict[str, Any]) -> str:
    """What blocks a topology: a failed txid (with the way out), or the stall rule -- or what is
    about to (a quarantine share rising towards its limit)."""
    if not summary["blocked_by"]:
        warning = summary.get("quarantine_warning")
        return f"<p class=blocked>Warning: {e(warning)}</p>" if warning else ""
    if summary.get("stalled"):
        return f"<p class=blocked>Stalled: {e(summary['blocked_by'].removeprefix('stalled: '))}</p>"
    return (f"<p class=blocked>Blocked: {e(summary['blocked_by'])}</p>"
            f"<p><a class=action href='{e(base)}{dag_path(summary['dag_id'])}/reprocess'>Reprocess the failed "
            "runs&#8230;</a> <span class=muted>(a preview first)</span></p>")


def read_count(t: dict[str, Any], unit: str | None) -> str:
    """What a txid read: the records its commit read; before its commit, its planned batch in the
    source's unit (a landing directory plans files, not records)."""
    c = t.get("commit")
    if c and c.get("records_read") is not None:
        return f"{c['records_read']:,}"
    n = int(t["planned_records"])
    return f"{n:,}" if unit in (None, "records") else plural(n, e(unit).removesuffix("s"))


def topology(base: str, summary: dict[str, Any], txns: list[dict[str, Any]], now: datetime, *,
             backfill: int | None = None) -> str:
    """A transactional DAG's page: where it stands, its timeline and its commit log."""
    tid, dag = summary["topology_id"], summary["dag_id"]
    blocked = _blocked(base, summary)
    if backfill is not None:
        blocked = (f"<p class=ok>Backfill {int(backfill)} created: Airflow reprocesses the failed runs; the "
                   "timeline below fills in as they commit.</p>") + blocked
    def tries(t: dict[str, Any]) -> str:
        failed = int(t.get("failed_tries") or 0)
        return str(len(t["attempts"])) + (f" ({plural(failed, 'failed try')})" if failed else "")

    checking = summary.get("verified_through") is not None  # the shadow audit ran: each txid's check
    log_rows = [[f"<a href='{e(base)}/dags/{quote(dag, safe='')}/runs/{quote(t['run_id'], safe='')}'>"
                 f"{t['txid']}</a>", e(t["run_id"]) + corrects(t), e(txn_status(t)),
                 read_count(t, summary.get("lag_unit")), tries(t),
                 when(t["commit"]["committed_at"]) if t["commit"] else "-",
                 committed(t["commit"]) if t["commit"] else "-",
                 f"{t['commit']['quarantined']:,}" if t["commit"] else "-",
                 *([check_cell(t["commit"])] if checking else [])] for t in txns]
    body = (f"<h1>Topology {e(tid)}</h1>{blocked}"
            f"<p>Committed txid <b>{summary['committed_txid']}</b>, last commit "
            f"{age(summary['last_commit_age_seconds'])}, {summary['commits_per_minute']:.1f} commits/min, "
            f"{lag_text(summary)} behind the source, "
            f"{summary['quarantined']:,} records quarantined{skipped_text(summary)}.</p>"
            f"<p>In flight: {'<br>'.join(flight_line(f) for f in summary['in_flight']) or 'nothing'}</p>"
            + changing(summary) + verified(base, summary)
            + "<h2>Timeline</h2><p class=muted>Each row is a txid: <span style='color:#a0aec0'>plan</span>, "
            "processing attempts (<span style='color:#48bb78'>complete</span>, "
            "<span style='color:#e53e3e'>failed</span>, <span style='color:#d69e2e'>running</span>) and the "
            "<span style='color:#3182ce'>commit</span>. Overlapping rows are transactions in flight at once; "
            "commits follow txid order.</p>"
            + _bars(txns, now)
            + "<h2>Transactions</h2>"
            + table(["txid", "run", "status", "records", "attempts", "committed at", "rows committed",
                     "quarantined", *(["check"] if checking else [])], log_rows, numeric=(0, 3, 4, 7))
            + (f"<form method=get class=correct action='{e(base)}{dag_path(dag)}/correct'><label>Fixed a bug? "
               "Correct committed txids <input name=txids placeholder='A..B' size=12></label> "
               "<button type=submit>Preview the correction</button></form>" if summary["committed_txid"] else ""))
    return page(f"Topology {tid}", body)


def not_transactional(dag_id: str) -> str:
    return page("Not transactional", f"<p class=muted>DAG {e(dag_id)} is not a transactional topology (or has not "
                                     "run yet): nothing to show here.</p>")


def full_log(base: str, dag_id: str, run_id: str, reason: str) -> str:
    """A link to the whole story of a failure the page tells in one line: the failed task's log in
    Airflow's UI (mounted beside this plugin), every try with its command line and output."""
    named = reason.split(":", 1)[0]  # the reason starts with the task that failed
    task = named if named in TASK_ORDER else "process"
    airflow = base.removesuffix(PLUGIN_PREFIX)
    return (f"<p><a href='{e(airflow)}{run_path(dag_id, run_id)}/tasks/{task}'>The {task} task's log in Airflow</a> "
            "<span class=muted>(each try: the command line, the output, the whole error)</span></p>")


#: Quarantined records a run page shows at a time.
QUARANTINE_PAGE = 200


def pager(here: str, reason: str | None, at_page: int, shown: int, total: int) -> str:
    """Which of ``total`` records this page shows, with links to the pages beside it."""
    first = at_page * QUARANTINE_PAGE

    def link(to: int, label: str) -> str:
        return f"<a href='{here}?{e(urlencode({**({'reason': reason} if reason else {}), 'page': to}))}'>{label}</a>"

    around = [link(at_page - 1, "&#8592; previous")] if at_page > 0 else []
    around += [link(at_page + 1, "next &#8594;")] if first + shown < total else []
    span = (f"records {first + 1:,}&#8211;{first + shown:,} of {total:,}" if shown
            else f"no record on this page of {total:,}")
    return f"<p class=muted>{span}{' &#183; ' if around else ''}{' '.join(around)}</p>"


def run(base: str, dag_id: str, run_id: str, txn: dict[str, Any] | None, records: list[dict[str, Any]],
        reason: str | None, *, cleared: int | None = None, at_page: int = 0) -> str:
    """One DAG run's transaction: its batch, attempts, commit and quarantined records (``page`` of
    them at ``at_page``, :data:`QUARANTINE_PAGE` a page, of one kind of ``reason`` or all)."""
    here = f"{e(base)}{run_path(dag_id, run_id)}"
    notice = "" if cleared is None else (
        f"<p class=ok>Cleared {int(cleared)} task instance(s): Airflow runs them again.</p>")
    action = (f"<p><a class=action href='{here}/clear'>Clear this run's failed tasks&#8230;</a> "
              "<span class=muted>(a preview first)</span></p>")
    if txn is None:
        return page("No transaction", notice + f"<p class=muted>Run {e(run_id)} has no transaction (its plan task "
                                               "has not run, or failed before it took a batch).</p>" + action)
    if txn["commit"] is not None:
        action = ""
    offsets = spans(txn["start_offsets"] or {}, txn["end_offsets"] or {})
    batch = (f"{plural(len(txn['files']), 'file')}: {', '.join(e(f) for f in txn['files'])}" if txn["files"] else
             f"{txn['planned_records']:,} records, offsets {offsets}")
    attempts = table(
        ["attempt", "status", "started", "finished", "records read", "rows staged", "quarantined", "error"],
        [[str(a["attempt"]), e(a["status"]), when(a["started_at"]), when(a["finished_at"]),
          "-" if a["records_read"] is None else f"{a['records_read']:,}", counts(a["row_counts"]),
          f"{a['quarantined']:,}", f"<pre>{e(a['error'])}</pre>" if a["error"] else "-"] for a in txn["attempts"]],
        numeric=(0, 4, 6))
    c = txn["commit"]
    commit = (f"<p class=ok>Committed at {when(c['committed_at'])} (attempt {e(c['attempt'])}, "
              f"{e(c['records_read'])} records read; {committed(c)}).</p>{provenance(c)}"
              + (check(c) if txn.get("verifying") else "") if c
              else "<p class=muted>Not committed.</p>")
    tries = int(txn.get("failed_tries") or 0)  # also the tries whose driver never registered an attempt
    failure = ""
    if txn["failure"]:
        failure = (f"<p class=blocked>Failed for good{f' after {tries} failed tries' if tries else ''}: "
                   f"{e(txn['failure'])}</p>" + full_log(base, dag_id, run_id, txn["failure"]))
    elif tries and c is None:
        failure = (f"<p class=blocked>Processing failed {tries} time(s), the last: {e(txn['last_try_failure'])}</p>"
                   + full_log(base, dag_id, run_id, txn["last_try_failure"] or ""))
    reasons = "".join(f"<option value='{e(r['reason'])}'{' selected' if r['reason'] == reason else ''}>"
                      f"{e(r['reason'])} ({r['records']:,})</option>" for r in txn["quarantine_reasons"])
    if txn["quarantine_reasons"]:
        csv_query = urlencode({"reason": reason}) if reason else ""
        quarantine = (
            f"<form method=get action='{here}'><label>Reason <select name=reason><option value=''>all</option>"
            f"{reasons}</select></label> <button>Filter</button> "
            f"<a href='{e(base)}/api/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/quarantine.csv"
            f"{'?' + e(csv_query) if csv_query else ''}' download>Download CSV</a></form>"
            + table(["attempt", "offset", "event id", "reason", f"record (first {RECORD_CHARS} characters)",
                     "committed"],
                    [[str(r["attempt"]), e(r["source_offset"]), e(r["event_id"]), e(r["reason"]),
                      f"<pre>{e((r['record'] or '')[:RECORD_CHARS])}"
                      f"{'&#8230;' if len(r['record'] or '') > RECORD_CHARS else ''}</pre>",
                      "yes" if r["committed"] else "no"] for r in records])
            + pager(here, reason, at_page, len(records), sum(r["records"] for r in txn["quarantine_reasons"]
                                                         if reason is None or r["reason"] == reason)))
    else:
        quarantine = "<p class=muted>No record of this batch was quarantined.</p>"
    corrects = txn.get("corrects") or {}
    if corrects.get("txids"):
        first, last = corrects["txids"]
        batch = (f"<b>a correction of txids {int(first)}..{int(last)}</b>: their records, read again under the "
                 "code deployed now; its commit applies the difference from what they applied")
    body = (f"<h1>Run {e(run_id)}: txid {txn['txid']}</h1>{notice}{failure}{action}"
            f"<p>Batch: {batch}; planned at {when(txn['planned_at'])}.</p>"
            f"<h2>Attempts</h2>{attempts}<h2>Commit</h2>{commit}<h2>Quarantined records</h2>{quarantine}")
    return page(f"txid {txn['txid']}", body)
