"""What a topology tells the platform's monitoring, through Airflow's own metrics: StatsD or
OpenTelemetry, however Airflow is configured (``[metrics]``); nothing is sent when metrics are off.

Every name is ``transactional.<topology_id>.<metric>`` (the topology in the name, as Airflow's own
per-DAG metrics do, so plain StatsD tells topologies apart), with the tag ``topology_id`` for
backends that keep tags:

========================  ======  ==============================================================
``committed_txid``        gauge   the txid just committed
``commit_duration``       timer   the commit's one Postgres transaction (ms)
``batch_records``         gauge   records the committed batch read
``records_committed``     count   the same, summed by the backend
``quarantined``           count   records the committed batch set aside
``lag_records``           gauge   records the source holds beyond the committed offsets
``lag_seconds``           gauge   how long the oldest of those has waited (0 when none does;
                                  sent only for sources that know when a record arrived)
``blocked``               gauge   1 while a failed txid blocks the topology, 0 after a commit
``late_commits``          count   runs that missed the topology's ``commit_deadline``
``stalled``               gauge   1 while the topology is stalled (no commit for ``stall_after``
                                  with records waiting), 0 after a commit
``stall_seconds``         gauge   how long it has not moved while stalled (0 when not stalled)
``verified_through``      gauge   the shadow audit's mark: the txids through it are verified
``verification_failures`` gauge   committed txids whose check failed (0 when none)
``build_through_txid``    gauge   while a state is built from the history: the txid its fold has
                                  reached (of ``build_of_txid``, M: ``core/building.py``)
``build_of_txid``         gauge   the txid the build's fold ends at (M)
``build_eta_seconds``     gauge   the seconds left at the rate of the fold so far (once known)
========================  ======  ==============================================================

Sent by the commit task after it commits (the ``build_`` ones too, while a build runs; ``blocked``
when it or a plan fails fast; ``late_commits`` and ``stalled`` by the commit deadline's callback in
the triggerer; ``stalled`` and
``stall_seconds`` at every check of the stall watch, :mod:`airflow_transactional.airflow.stalls`;
``verified_through`` and ``verification_failures`` by the verify task after its round), so a
backfill or a clear that commits nothing new sends nothing twice. A metric that cannot be sent
never fails a commit.
"""

from __future__ import annotations

import logging
from typing import Any

from ..model import BuildProgress

log = logging.getLogger(__name__)

PREFIX = "transactional"


def _stats() -> Any:
    from airflow.sdk.observability import stats

    return stats


def name(topology_id: str, metric: str) -> str:
    return f"{PREFIX}.{topology_id}.{metric}"


def committed(topology_id: str, *, txid: int, duration_ms: float, records: int, quarantined: int,
              lag_records: int, lag_seconds: float | None, build: BuildProgress | None = None) -> None:
    """The metrics of one commit that did commit (``build``: how far a state build is)."""
    try:
        stats, tags = _stats(), {"topology_id": topology_id}
        if build is not None:
            stats.gauge(name(topology_id, "build_through_txid"), build.through_txid, tags=tags)
            stats.gauge(name(topology_id, "build_of_txid"), build.of_txid, tags=tags)
            if build.eta_seconds is not None:
                stats.gauge(name(topology_id, "build_eta_seconds"), round(build.eta_seconds), tags=tags)
        stats.gauge(name(topology_id, "committed_txid"), txid, tags=tags)
        stats.timing(name(topology_id, "commit_duration"), duration_ms, tags=tags)
        stats.gauge(name(topology_id, "batch_records"), records, tags=tags)
        stats.incr(name(topology_id, "records_committed"), records, tags=tags)
        stats.incr(name(topology_id, "quarantined"), quarantined, tags=tags)
        stats.gauge(name(topology_id, "lag_records"), lag_records, tags=tags)
        if lag_seconds is not None:
            stats.gauge(name(topology_id, "lag_seconds"), round(lag_seconds, 3), tags=tags)
        stats.gauge(name(topology_id, "blocked"), 0, tags=tags)
        stats.gauge(name(topology_id, "stalled"), 0, tags=tags)
    except Exception:  # a metric never fails a commit
        log.warning("topology %s: metrics of txid %d not sent", topology_id, txid, exc_info=True)


def blocked(topology_id: str) -> None:
    """The topology is blocked by a failed txid (a task failed fast because of it)."""
    try:
        _stats().gauge(name(topology_id, "blocked"), 1, tags={"topology_id": topology_id})
    except Exception:
        log.warning("topology %s: the blocked metric was not sent", topology_id, exc_info=True)


def late(topology_id: str, *, stalled: bool = False) -> None:
    """A run missed the topology's commit deadline (sent by the deadline's callback); ``stalled``:
    the topology's status says it is."""
    try:
        stats, tags = _stats(), {"topology_id": topology_id}
        stats.incr(name(topology_id, "late_commits"), 1, tags=tags)
        if stalled:
            stats.gauge(name(topology_id, "stalled"), 1, tags=tags)
    except Exception:
        log.warning("topology %s: the late_commits metric was not sent", topology_id, exc_info=True)


def stall(topology_id: str, *, stalled_seconds: float | None) -> None:
    """One check of the stall watch: stalled for ``stalled_seconds``, or not stalled (None)."""
    try:
        stats, tags = _stats(), {"topology_id": topology_id}
        stats.gauge(name(topology_id, "stalled"), 0 if stalled_seconds is None else 1, tags=tags)
        stats.gauge(name(topology_id, "stall_seconds"), round(stalled_seconds or 0.0), tags=tags)
    except Exception:
        log.warning("topology %s: the stalled metric was not sent", topology_id, exc_info=True)


def verified(topology_id: str, *, verified_through: int, failures: int) -> None:
    """The shadow audit's mark and how many checks failed, after a round."""
    try:
        stats, tags = _stats(), {"topology_id": topology_id}
        stats.gauge(name(topology_id, "verified_through"), verified_through, tags=tags)
        stats.gauge(name(topology_id, "verification_failures"), failures, tags=tags)
    except Exception:
        log.warning("topology %s: the verification metrics were not sent", topology_id, exc_info=True)
