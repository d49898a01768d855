"""The checks, independent of the provider's code paths: the state tables against the oracle the
ledger gives (by event id), the audit log's order, the quarantine against the malformed records
injected, and ``airflow-txn audit`` -- or in payments mode the invariants of ``dev/payments.py``
(``payments.py``); in kafka mode the words checks on the records the producers committed, less
those the topology reported skipped after a deletion (``kafka.py``). They need only the run's
Postgres and its ledger, so a run whose harness died can be judged after the fact (``--check DIR``)."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psycopg2
from psycopg2 import sql

from dev.kafka import KafkaBroker

from . import kafka, objects, payments
from .config import LOG, TOPOLOGY, ChaosConfig, ChaosReport, dag_env, dag_file
from .workload import Ledger


def check(dsn: str, cfg: ChaosConfig, report: ChaosReport, ledger: Ledger, dags_folder: Path | None = None,
          broker: KafkaBroker | None = None) -> None:
    """Fill ``report``'s outcome from the state in ``dsn`` and the ``ledger`` (the audit runs the
    topologies from their DAG file as deployed in ``dags_folder``, else from the repository; in
    kafka mode what was published is read from ``broker``, when given)."""
    report.mode = cfg.mode
    driven, *downstream = cfg.topologies
    orders = {t: commit_order(dsn, t) for t in cfg.topologies}
    report.transactions_committed = len(orders[driven])
    report.commits_downstream = {t: len(orders[t]) for t in downstream}
    for order in orders.values():  # the audit log holds txids 1..N, each once, committed in order
        report.order_violations += sum(1 for a, b in itertools.pairwise(order) if b != a + 1)
        report.order_violations += bool(order) and order[0] != 1
    if cfg.mode == "payments":
        payments.check(dsn, report, ledger)
    elif cfg.mode == "s3":
        compare_words(dsn, report, objects.expected(dsn, report, ledger), objects.TOPOLOGY, objects.TOKEN)
    elif cfg.mode == "kafka":
        expected = kafka.expected(dsn, report, ledger)
        compare_words(dsn, report, expected, kafka.TOPOLOGY)
        if broker is not None and not report.post_mortem:
            kafka.check_published(broker, report, expected)
    else:
        check_words(dsn, report, ledger)
        if cfg.verify:
            check_verified(dsn, report, TOPOLOGY)
    if cfg.audit:
        deployed = dags_folder / dag_file(cfg).name if dags_folder is not None else dag_file(cfg)
        for topology in cfg.topologies:
            env = {**os.environ, **dag_env(cfg), "AIRFLOW_TXN_DSN": dsn}
            res = subprocess.run([str(Path(sys.executable).with_name("airflow-txn")), "audit", topology,
                                  "--dag-file", str(deployed)],
                                 env=env, capture_output=True, text=True, check=False, timeout=900)
            why = objects.audit_refused if cfg.mode == "s3" else kafka.audit_refused
            refused = why(res.stdout + res.stderr, ledger) if res.returncode else ""
            if refused:  # the harness's own delete_records (or overwrites) took committed records
                report.audit_refused = refused
                continue
            report.audit_clean = report.audit_clean is not False and res.returncode == 0
            if res.returncode:
                report.problems.append(f"audit of {topology}: " + (res.stdout + res.stderr)[-2000:])


def check_verified(dsn: str, report: ChaosReport, topology: str) -> None:
    """What the runs' verify tasks found: every committed txid verified (recomputed from its source
    and checked against its commit), none failed, skipped or left pending, and the mark at the end
    (not after the fact: a run that never drained left txids for rounds that never came)."""
    if report.post_mortem:
        return
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT verified_through, committed_txid FROM airflow_txn.topologies WHERE topology_id = %s",
                    (topology,))
        mark, committed = cur.fetchone() or (0, 0)
        cur.execute("SELECT coalesce(v.status, 'pending'), count(*) FROM airflow_txn.commits c LEFT JOIN "
                    "airflow_txn.verifications v USING (topology_id, txid) WHERE c.topology_id = %s GROUP BY 1",
                    (topology,))
        report.verification = {str(s): int(n) for s, n in cur.fetchall()}
    conn.close()
    report.verified_through = int(mark)
    if mark != committed:
        report.problems.append(f"the shadow audit's mark is at txid {mark} of {committed} committed")


def commit_order(dsn: str, topology: str) -> list[int]:
    """The topology's committed txids in the order they committed."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT txid FROM airflow_txn.commits WHERE topology_id = %s ORDER BY committed_at, txid",
                    (topology,))
        order = [int(t) for (t,) in cur.fetchall()]
    conn.close()
    return order


def check_words(dsn: str, report: ChaosReport, ledger: Ledger) -> None:
    """The words state against the oracle of the ledger's events, by event id."""
    r = report
    r.events_appended = len(ledger.valid) + len(ledger.malformed)
    r.duplicate_deliveries, r.malformed_injected = ledger.duplicates, len(ledger.malformed)
    if r.post_mortem:
        # A run that never drained is checked on what it committed: the ledger's events that
        # the log put at or below the committed checkpoint (its own LSNs, not our processing).
        due = committed_event_ids(dsn)
        r.events_pending = r.events_appended - len(due & (set(ledger.valid) | ledger.malformed))
        ledger = ledger.restricted_to(due)
    compare_words(dsn, report, ledger, TOPOLOGY)
    corrections_changed(dsn, report, TOPOLOGY)


def corrections_changed(dsn: str, report: ChaosReport, topology: str) -> None:
    """The corrections committed, and the keys they changed: each corrected one txid under the code
    it was committed with, so a deterministic job's corrections change nothing (their digests say
    how many rows each applied); and the replays committed (what they counted, the oracle checks)."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT txid, digests FROM airflow_txn.commits WHERE topology_id = %s AND corrects IS NOT NULL "
                    "AND NOT corrects ? 'replay'", (topology,))
        found = cur.fetchall()
        cur.execute("SELECT count(*) FROM airflow_txn.commits WHERE topology_id = %s AND corrects ? 'replay'",
                    (topology,))
        report.replays = int(cur.fetchone()[0])
    conn.close()
    report.corrections = len(found)
    for txid, digests in found:
        rows = sum(int(str(d).split(":")[0]) for d in (digests or {}).values())
        report.corrections_changed += rows
        if rows:
            report.problems.append(f"correction txid {txid} changed {rows} keys under the code it re-ran: {digests}")


def compare_words(dsn: str, report: ChaosReport, ledger: Ledger, topology: str,
                  token: re.Pattern[str] | None = None) -> None:
    """``topology``'s url and domain counts against the ledger's, and its quarantine against the
    ledger's malformed records (each exactly once): by event id, or by the ``token`` each holds
    (a landed file's lines have no ids)."""
    r = report
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT url, value FROM {}").format(sql.Identifier(f"{topology}_url_counts")))
        urls = {u: int(v) for u, v in cur.fetchall()}
        cur.execute(sql.SQL("SELECT domain, value FROM {}").format(sql.Identifier(f"{topology}_domain_counts")))
        domains = {d: int(v) for d, v in cur.fetchall()}
        cur.execute("SELECT event_id, record FROM airflow_txn.quarantine WHERE topology_id = %s AND committed",
                    (topology,))
        quarantined = Counter(e if token is None else (m.group(0) if (m := token.search(rec or "")) else rec)
                              for e, rec in cur.fetchall())
    conn.close()
    want = ledger.url_counts()
    for url in set(want) | set(urls):
        diff = urls.get(url, 0) - want.get(url, 0)
        r.events_lost += max(0, -diff)
        r.events_duplicated += max(0, diff)
    want_domains = ledger.domain_counts()
    r.domain_mismatches = sum(1 for d in set(want_domains) | set(domains)
                              if domains.get(d, 0) != want_domains.get(d, 0))
    r.quarantine_mismatches = (sum(abs(quarantined[e] - 1) for e in ledger.malformed)
                               + sum(n for e, n in quarantined.items() if e not in ledger.malformed))


def committed_event_ids(dsn: str) -> set[str]:
    """The ids of the events at or below the topology's committed offsets, per partition."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT committed_offsets FROM airflow_txn.topologies WHERE topology_id = %s", (TOPOLOGY,))
        row = cur.fetchone()
        offsets = {int(p): int(lsn) for p, lsn in (row[0] if row else {}).items()}
        cur.execute("SELECT partition, lsn, event_id FROM airflow_txn.log_events WHERE log_name = %s", (LOG,))
        due = {e for p, lsn, e in cur.fetchall() if lsn <= offsets.get(p, 0)}
    conn.close()
    return due
