"""How a waiting task finds out that the txid it waits for will never commit (docs/design.md,
trap 2). Shared by a task that waits in its worker (``deferrable=False``) and by the trigger that
waits for it in Airflow's triggerer (:mod:`airflow_transactional.airflow.triggers`): the same rules, the
same words, wherever the wait happens."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from contextvars import copy_context
from typing import Any

from ..coordinator import Coordinator

#: What a run-state lookup says of a run Airflow no longer has.
DELETED = "deleted"


def _not_found(exc: Exception) -> bool:
    """Whether a Task SDK call failed because the api-server has no such object (HTTP 404)."""
    detail = getattr(getattr(exc, "error", None), "detail", None)
    return isinstance(detail, dict) and detail.get("status_code") == 404


def run_state(ask: Callable[[], Any], run_id: str, log: logging.Logger | Any) -> str | None:
    """Airflow's state of a DAG run as ``ask()`` returns it; :data:`DELETED` when Airflow has no
    such run (HTTP 404), None when it cannot say (the API away for a moment)."""
    try:
        state = ask()
    except Exception as exc:
        if _not_found(exc):
            return DELETED
        log.debug("no Airflow state for run %s: %s", run_id, exc)
        return None
    return str(getattr(state, "value", state))


class Watch:
    """The fail-fast rules of one waiting task.

    ``run_state(run_id)`` is Airflow's state of a run of the topology's DAG (:func:`run_state`);
    Airflow is asked at most every ``check_interval`` seconds. A blocker must hold for
    ``blocked_grace`` seconds before it counts: that covers a cleared or backfilled predecessor
    whose tasks have not started yet (starting lifts the failed mark).

    With ``asks_on`` (the triggerer's threads), Airflow is asked there, beside the wait: an answer
    can take seconds (the triggerer relays it through its supervisor), and a commit whose turn
    came in the meantime must not wait for it. A look then uses the last answer that arrived.
    """

    def __init__(self, topology_id: str, run_state: Callable[[str], str | None], *, blocked_grace: float,
                 check_interval: float, log: logging.Logger | Any, asks_on: Executor | None = None) -> None:
        self.topology_id = topology_id
        self.run_state = run_state
        self.blocked_grace = blocked_grace
        self.check_interval = check_interval
        self.log = log
        self.asks_on = asks_on
        self.since: float | None = None  # when the current blocker was first seen
        self._checked_at: float | None = None
        self._verdict: str | None = None
        self._state: str | None = None
        self._asking: tuple[int, str, Future[str | None]] | None = None  # (pred, run id, Airflow's answer)
        self._orphans_checked_at: float | None = None
        self._orphans: Future[list[tuple[int, str]]] | None = None

    def still_blocked(self, coordinator: Coordinator, txid: int) -> str | None:
        """The blocker of ``txid`` once it has held for ``blocked_grace`` (else None).

        A blocker is an earlier txid that failed for good (recorded in Postgres), or one whose
        Airflow run will not commit it (:meth:`stalled_predecessor`); a deleted run outranks the
        record, whose advice (clear that run) no longer applies.
        """
        recorded = coordinator.blocker(self.topology_id, txid)
        stalled = self.stalled_predecessor(coordinator, txid)
        blocked = stalled if stalled and self._state == DELETED else (recorded or stalled)
        if blocked is None:
            self.since = None
            return None
        if self.since is None:
            self.since = time.monotonic()
            self.log.warning("%s -- failing in %.0fs unless it is retried", blocked, self.blocked_grace)
        return blocked if time.monotonic() - self.since >= self.blocked_grace else None

    def stalled_predecessor(self, coordinator: Coordinator, txid: int) -> str | None:
        """Why the txid that ``txid`` waits for will not commit, by Airflow's view of its run (or None).

        A task that fails for good says so in Postgres; one killed on its last try (SIGKILL, the
        OOM killer, a lost worker) says nothing, and the runs waiting for it would hold their
        ``max_active_runs`` slots until the cleared run could never start (docs/design.md, trap 2).
        Airflow knows better: that run is failed. A run that is not running at all cannot commit
        either: queued behind the slots its waiters hold, finished without committing (marked
        success by hand), or deleted (the next run of the DAG takes its batch over, see
        :meth:`.operators.plan.PlanOperator.adopt_orphan`). A failed, finished or deleted run is also recorded as
        failed in Postgres, so ``airflow-txn status`` names it.
        """
        if self._asking is not None:
            pred, run_id, answer = self._asking
            if not answer.done():
                return self._verdict
            self._asking = None
            return self._judge(coordinator, txid, pred, run_id, answer.result())
        now = time.monotonic()
        if self._checked_at is not None and now - self._checked_at < self.check_interval:
            return self._verdict
        self._checked_at = now
        pending = coordinator.first_pending(self.topology_id, txid)
        if pending is None:
            self._verdict = self._state = None
            return None
        pred, run_id = pending
        if self.asks_on is not None:
            self._asking = (pred, run_id, self.asks_on.submit(copy_context().run, self.run_state, run_id))
            return self._verdict
        return self._judge(coordinator, txid, pred, run_id, self.run_state(run_id))

    def _judge(self, coordinator: Coordinator, txid: int, pred: int, run_id: str, state: str | None) -> str | None:
        """The verdict on ``pred`` given its run's ``state``, asked after ``pred`` was seen pending.

        The run's end is read before the commit is looked at again: a run ends after its commit,
        so a predecessor that committed while Airflow was asked is seen committed here -- never
        "finished without committing".
        """
        self._verdict, self._state = None, state
        if state in (None, "running") or coordinator.first_pending(self.topology_id, txid) != (pred, run_id):
            return None
        attempt_error = coordinator.last_error(self.topology_id, pred) if state == "failed" else None
        why = {"failed": attempt_error or "its Airflow run failed without recording why (a task killed on its "
                                          "last try: SIGKILL, out of memory, a lost worker?)",
               "success": f"its Airflow run finished without committing txid {pred} (marked success by hand?)",
               "queued": "its Airflow run is queued and cannot start while the runs waiting for it hold the "
                         "DAG's max_active_runs slots",
               DELETED: "its Airflow run was deleted"}.get(state, f"its Airflow run is {state}")
        if state in ("failed", "success", DELETED):
            coordinator.mark_failed(self.topology_id, pred, why)
        fix = ("The next run of this DAG takes its batch over: trigger one (or let the schedule start it)"
               if state == DELETED else "Clear that run's tasks or backfill it with 'reprocess failed'")
        self._verdict = f"blocked by txid {pred} (run {run_id}): {why}. {fix}; this run can then be cleared too"
        return self._verdict

    def deleted_runs(self, run_ids: Iterable[tuple[int, str]]) -> list[tuple[int, str]]:
        """The (txid, run id) pairs whose Airflow run is gone, on Airflow's word (HTTP 404), never on
        silence; asked at most every ``check_interval`` seconds (else no answer: []). With
        ``asks_on``, the answer of the last asking, once it has arrived."""
        if self._orphans is not None:
            if not self._orphans.done():
                return []
            answer, self._orphans = self._orphans.result(), None
            return answer
        now = time.monotonic()
        if self._orphans_checked_at is not None and now - self._orphans_checked_at < self.check_interval:
            return []
        self._orphans_checked_at = now
        pairs = list(run_ids)
        if self.asks_on is not None:
            self._orphans = self.asks_on.submit(copy_context().run, self._deleted, pairs)
            return []
        return self._deleted(pairs)

    def _deleted(self, pairs: list[tuple[int, str]]) -> list[tuple[int, str]]:
        return [(txid, run_id) for txid, run_id in pairs if self.run_state(run_id) == DELETED]
