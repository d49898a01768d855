"""The stall watch: one small DAG that checks every topology's stall rule on a schedule and alerts,
with no ``commit_deadline`` needed.

A topology is *stalled* when it has not committed for its ``stall_after`` while its source holds
records (:func:`airflow_transactional.core.liveness.stalled`), or when a txid that failed for good
blocks it (a batch quarantined over its ``max_quarantined`` among them). Its own tasks cannot say so when
they are what is stuck -- a process task waiting for a pool slot that other DAGs hold, a run queued
behind ``max_active_runs``, a paused DAG -- so a separate DAG looks from outside::

    from airflow_transactional import stall_watch_dag

    dag = stall_watch_dag(schedule="*/5 * * * *", on_stall="my_alerts.page_on_call")

Each check sends the gauges ``transactional.<topology>.stalled`` (1 or 0) and ``stall_seconds``,
logs a warning per stalled topology with what its next txid waits for (in the store, and in
Airflow: its task's state), and calls ``on_stall`` once per stall -- when a topology becomes
stalled, or committed and stalled again since the previous check, not at every check while it
stays so (the previous check's verdicts, each stall's start, are its XCom).
``on_stall(*, topology_id, reason, stalled_seconds, context)`` runs in the watch's worker: page
someone, post to a channel. A topology that commits again is logged as recovered.

It warns, and calls ``on_stall`` once (``stalled_seconds`` 0), when a topology's latest txids set
aside half their ``max_quarantined`` or more -- an upstream change on its way, before a txid is
refused -- and again after the share fell and rose anew.

It also alerts on the shadow audit (``docs/guides/verification.md``): a committed txid whose check
failed is logged, sent as the gauge ``verification_failures``, and given to ``on_stall`` once (its
reason names the txid, the states and the keys; ``stalled_seconds`` 0) -- whichever task found it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from airflow.sdk import DAG, BaseOperator

from ..coordinator import PATIENT_LAG_WAIT
from ..exceptions import ConfigError
from ..model import TopologyStatus
from . import metrics
from .callbacks import imported
from .hooks import TransactionalHook
from .operators.verify import failed_checks

__all__ = ["StallWatchOperator", "stall_watch_dag"]

#: The XCom key of a check's verdicts: ``{topology_id: stalled since (ISO time)}``.
XCOM_KEY = "stalled"
#: ... and of the failed checks of the shadow audit it has alerted on: ``{topology_id: [txid, ...]}``.
FAILED_KEY = "failed_checks"
#: The XCom key of the topologies warned of a rising quarantine share (alerted once until it falls).
RISING_KEY = "quarantine_rising"
#: A topology's tasks, in the order a transaction runs them.
TASK_ORDER = ("plan", "process", "commit", "publish")
#: What a task in each Airflow state is waiting for.
WAITING = {
    "scheduled": "is scheduled: waiting for a slot of its pool or the scheduler's limits",
    "queued": "is queued: waiting for a worker to start it",
    "deferred": "waits in the triggerer for its turn",
    "up_for_retry": "failed a try and waits for its retry",
    "up_for_reschedule": "waits to be rescheduled",
    "running": "is running",
}


class Stall(NamedTuple):
    topology_id: str
    reason: str
    since: datetime


def stall_of(status: TopologyStatus, now: datetime) -> Stall | None:
    """The topology's stall as its status says it (None: not stalled), since when it has not moved.
    A topology blocked by a txid that failed for good (a batch quarantined over its
    ``max_quarantined``, a job that fails every try) does not move either until someone acts: it
    is stalled from its last commit on, the blocker its reason."""
    if not status.blocked_by:
        return None
    nxt = next((f for f in status.in_flight if f.txid == status.committed_txid + 1), None)
    since = status.last_commit_at or (nxt.since if nxt else None) or now
    return Stall(status.topology_id, status.blocked_by, since)


def is_new(stall: Stall, seen_since: str | None, status: TopologyStatus) -> bool:
    """Whether ``stall`` is not the one the previous check saw (stalled since ``seen_since``): it
    was not stalled then, or it committed in between and stalled again."""
    if seen_since is None:
        return True
    return status.last_commit_at is not None and stall.since > datetime.fromisoformat(seen_since)


def airflow_says(task_states: Mapping[str, Any]) -> str | None:
    """What Airflow says the run's first unfinished task waits for, from its tasks' states."""
    for task in TASK_ORDER:
        state = task_states.get(task)
        state = None if state is None else str(getattr(state, "value", state))
        if task in task_states and state not in ("success", "skipped", "failed", "upstream_failed", "removed"):
            return f"Airflow: its {task} task " + WAITING.get(state or "", "has not been scheduled yet")
    return None


def resolve_callback(callback: Callable[..., Any] | str | None) -> Callable[..., Any] | None:
    """``on_stall`` as a callable: a dotted path is imported (a wrong one refused with the fix)."""
    if callback is None or callable(callback):
        return callback
    target = imported(callback, setting="on_stall", kind="a function", where="the workers run")
    if not callable(target):
        raise ConfigError(f"on_stall must be a function or its dotted path, got {callback!r}")
    return target


class StallWatchOperator(BaseOperator):
    """One check of every topology's stall rule (or of ``topologies``): metrics, a warning per
    stalled topology, ``on_stall`` once per stall. Fails only when the store cannot be read."""

    ui_color = "#fdf0e0"

    def __init__(self, *, transactional_conn_id: str = "transactional_default",
                 topologies: Sequence[str] | None = None, on_stall: Callable[..., Any] | str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.transactional_conn_id = transactional_conn_id
        self.topologies = list(topologies) if topologies is not None else None
        resolve_callback(on_stall)  # refused at parse time, not when a stall happens
        self.on_stall = on_stall
        self._dag_ids: dict[str, str] = {}  # topology -> its DAG, as the store's declarations say
        self._failures: dict[str, dict[str, Any]] = {}  # topology -> what its shadow audit found

    def execute(self, context: Mapping[str, Any]) -> None:
        ti, now = context["ti"], datetime.now(UTC)
        # The latest check's verdicts (map_indexes given: one value, not every prior run's).
        previous = ti.xcom_pull(task_ids=self.task_id, key=XCOM_KEY, include_prior_dates=True, map_indexes=-1) or {}
        stalls, statuses = self.check(now)
        for topology_id, status in statuses.items():
            stall = stalls.get(topology_id)
            metrics.stall(topology_id, stalled_seconds=None if stall is None else (now - stall.since).total_seconds())
            if stall is None:
                if topology_id in previous:
                    self.log.info("topology %s: no longer stalled (committed txid %d)", topology_id,
                                  status.committed_txid)
                continue
            reason = self.with_airflow_side(ti, status, stall.reason)
            self.log.warning("topology %s: %s", topology_id, reason)
            if is_new(stall, previous.get(topology_id), status):
                self.alert(stall, reason, now, context)
        ti.xcom_push(key=XCOM_KEY, value={s.topology_id: s.since.isoformat() for s in stalls.values()})
        warned = ti.xcom_pull(task_ids=self.task_id, key=RISING_KEY, include_prior_dates=True, map_indexes=-1) or []
        rising = {t: s.quarantine_warning for t, s in statuses.items() if s.quarantine_warning and t not in stalls}
        for topology_id, warning in rising.items():
            self.log.warning("topology %s: %s", topology_id, warning)
            if topology_id not in warned:
                self.alert(Stall(topology_id, warning, now), warning, now, context)
        ti.xcom_push(key=RISING_KEY, value=sorted(rising))
        alerted = ti.xcom_pull(task_ids=self.task_id, key=FAILED_KEY, include_prior_dates=True, map_indexes=-1) or {}
        ti.xcom_push(key=FAILED_KEY, value=self.failed_checks(alerted, context))

    def failed_checks(self, alerted: Mapping[str, list[int]], context: Mapping[str, Any]) -> dict[str, list[int]]:
        """Alert once on each committed txid whose check failed; the txids alerted on, by topology."""
        out: dict[str, list[int]] = {}
        callback = resolve_callback(self.on_stall)
        for topology_id, failures in self._failures.items():
            metrics.verified(topology_id, verified_through=failures["verified_through"],
                             failures=len(failures["failures"]))
            txids = [int(f["txid"]) for f in failures["failures"]]
            out[topology_id] = txids
            if not txids:
                continue
            reason = failed_checks(topology_id, failures["failures"])
            self.log.warning("%s", reason)
            if callback is not None and set(txids) - set(alerted.get(topology_id, [])):
                try:
                    callback(topology_id=topology_id, reason=reason, stalled_seconds=0.0, context=context)
                except Exception:  # one failing alert does not hide the other topologies'
                    self.log.exception("on_stall failed for topology %s", topology_id)
        return out

    def check(self, now: datetime) -> tuple[dict[str, Stall], dict[str, TopologyStatus]]:
        with TransactionalHook(self.transactional_conn_id).coordinator() as coordinator:
            known = {spec.topology_id: spec for spec in coordinator.topologies()}
            if self.topologies is not None:
                missing = sorted(set(self.topologies) - set(known))
                if missing:
                    self.log.warning("topologies %s are not registered in the store (yet): not watched", missing)
            watched = [t for t in known if self.topologies is None or t in self.topologies]
            self._dag_ids = {t: known[t].dag for t in watched}
            statuses = {}
            coordinator.ask_lags(watched)  # every Kafka cluster asked at once: the check waits for the slowest
            self._failures = {}
            for t in watched:
                try:
                    statuses[t] = coordinator.status(t, lag_wait=PATIENT_LAG_WAIT)
                    checked = coordinator.verify_status(t, 1, 0)
                    if checked["verified_through"] or checked["failures"] or checked["counts"].keys() - {"pending"}:
                        self._failures[t] = checked  # the shadow audit runs: what it found
                except Exception as exc:  # one unreadable topology does not blind the watch to the others
                    self.log.warning("topology %s: its status could not be read: %s", t, exc)
        stalls = {t: s for t, s in ((t, stall_of(st, now)) for t, st in statuses.items()) if s is not None}
        return stalls, statuses

    def with_airflow_side(self, ti: Any, status: TopologyStatus, reason: str) -> str:
        """The stall's reason, with what Airflow says the next txid's run waits for."""
        nxt = next((f for f in status.in_flight if f.txid == status.committed_txid + 1), None)
        if nxt is None:
            return reason
        try:
            states = ti.get_task_states(dag_id=self._dag_ids[status.topology_id], run_ids=[nxt.run_key])
        except Exception as exc:  # the reason from the store stands on its own
            self.log.info("no task states of run %s: %s", nxt.run_key, exc)
            return reason
        said = airflow_says(states.get(nxt.run_key) or {})
        return f"{reason}; {said}" if said else reason

    def alert(self, stall: Stall, reason: str, now: datetime, context: Mapping[str, Any]) -> None:
        callback = resolve_callback(self.on_stall)
        if callback is None:
            return
        try:
            callback(topology_id=stall.topology_id, reason=reason,
                     stalled_seconds=(now - stall.since).total_seconds(), context=context)
        except Exception:  # one failing alert does not hide the other topologies' stalls
            self.log.exception("on_stall failed for topology %s", stall.topology_id)


def stall_watch_dag(dag_id: str = "transactional_stall_watch", *, schedule: Any = "*/5 * * * *",
                    transactional_conn_id: str = "transactional_default", topologies: Sequence[str] | None = None,
                    on_stall: Callable[..., Any] | str | None = None, start_date: datetime | None = None,
                    **dag_kwargs: Any) -> DAG:
    """The stall watch's DAG (see the module's docs): one task on ``schedule``, one run at a time,
    no catch-up -- a check is about now. ``topologies``: only these (default: every topology the
    store knows). ``pool`` and the other task settings go through ``default_args``."""
    if topologies is not None and (isinstance(topologies, str) or not all(isinstance(t, str) for t in topologies)):
        raise ConfigError(f"topologies must be a list of topology ids, got {topologies!r}")
    dag = DAG(dag_id=dag_id, schedule=schedule, start_date=start_date or datetime(2024, 1, 1),
              catchup=dag_kwargs.pop("catchup", False), max_active_runs=1,
              tags=["transactional", *dag_kwargs.pop("tags", ())],
              default_args={"retries": 1, "retry_delay": timedelta(seconds=30),
                            **dag_kwargs.pop("default_args", {})},
              doc_md=dag_kwargs.pop("doc_md", None) or __doc__, **dag_kwargs)
    StallWatchOperator(task_id="check", transactional_conn_id=transactional_conn_id, topologies=topologies,
                       on_stall=on_stall, dag=dag)
    return dag
