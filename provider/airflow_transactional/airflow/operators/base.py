"""What the three tasks share: the topology's stored declaration and the run's transaction; and
what the two that may wait for their turn share: where they wait (the triggerer, or the worker)
and how they find out that the txid they wait for will never commit (:mod:`airflow_transactional.airflow.watch`)."""

from __future__ import annotations

import re
import signal
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, ClassVar, NoReturn, TypeVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from ...coordinator import Coordinator
from ...exceptions import ConfigError, NotYourTurn
from ...model import Transaction, one_line
from .. import lineage, metrics
from ..hooks import TransactionalHook
from ..triggers import TurnTrigger
from ..watch import DELETED, Watch, run_state

__all__ = ["DELETED", "TopologyTask", "WaitingTask", "failure_reason"]

T = TypeVar("T")

# How a job's process failed, and the lines it printed last: the Spark provider's message for a
# spark-submit (its whole command line first: JVM flags, paths, lineage ids), and ours for a
# Spark Connect client (operators/process.py).
_EXITED = (re.compile(r"Cannot execute: .*?\. Error code is: (-?\d+)\.(.*)", re.S),
           re.compile(r"the Spark Connect job \S+ exited with (-?\d+):(.*)", re.S))
_CAUSE = re.compile(r"(Error|Exception|error:|Killed|OutOfMemory"
                    # a shell's own complaint (the launcher scripts are bash): "spark-class: line 97: ...",
                    # a command or a file missing, a permission refused
                    r"|^\S+: line \d+: |command not found|No such file or directory|Permission denied)")
#: The job's own account of why it failed: the line its logger wrote (the task's log keeps the rest).
_OWN_WORDS = re.compile(r"\bERROR airflow_transactional\.[\w.]+: (.+)")
_KILLED = {signal.SIGKILL: "killed by SIGKILL: out of memory (the OOM killer), or killed by someone",
           signal.SIGTERM: "stopped by SIGTERM"}


def failure_reason(what: str, exc: BaseException) -> str:
    """Why a task's work failed, in one line an operator can act on: for a Spark job's process, its
    exit code (a signal by name) and the job's own words on why (its logger's ERROR line, which names
    the file, the txid and the way out), else the line of its output that names the cause -- not its
    command line; else the first line of the error that says something."""
    text = str(exc)
    found = next((m for m in (p.match(text) for p in _EXITED) if m is not None), None)
    if found is None:
        return f"{what} failed: {one_line(text) or type(exc).__name__}"
    code, tail = int(found.group(1)), found.group(2)
    how = f"exited with code {code}"
    try:  # a negative code is the signal that ended it; a shell reports it as 128 + the signal
        sig = signal.Signals(-code if code < 0 else code - 128)
        how += f" ({_KILLED.get(sig, f'killed by {sig.name}')})"
    except ValueError:
        pass
    lines = [line.strip() for line in tail.splitlines()
             if line.strip() and line.strip() != "Last spark-submit output:" and not line.strip().startswith("at ")]
    own = next((m[1] for m in map(_OWN_WORDS.search, reversed(lines)) if m is not None), None)
    cause = own or next((line for line in reversed(lines) if _CAUSE.search(line)), None)
    return f"{what} {how}" + (f": {one_line(cause)}" if cause else "")


class TopologyTask(BaseOperator):
    """Shared parts: the topology's stored declaration and the run's transaction."""

    ui_color = "#e8f4ea"
    #: Whether the task writes the topology's outputs: OpenLineage names them as its outputs.
    writes_outputs = False
    #: How often a waiting task asks Airflow about the run of the txid it waits for (seconds).
    airflow_check_interval = 5.0

    def __init__(self, *, topology: Mapping[str, Any], transactional_conn_id: str = "transactional_default",
                 blocked_grace: timedelta = timedelta(seconds=30), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.topology = dict(topology)
        self.transactional_conn_id = transactional_conn_id
        self.blocked_grace = blocked_grace

    @property
    def topology_id(self) -> str:
        return str(self.topology["topology_id"])

    def coordinator(self) -> Coordinator:
        return TransactionalHook(self.transactional_conn_id).coordinator()

    def run_transaction(self, coordinator: Coordinator, context: Mapping[str, Any]) -> Transaction:
        txn = coordinator.transaction_for_run(self.topology_id, context["run_id"])
        if txn is None:
            raise AirflowFailException(f"run {context['run_id']} has no transaction of topology "
                                       f"{self.topology_id!r}: clear its plan task first")
        return txn

    def report_commit(self, coordinator: Coordinator, txid: int, took: float,
                      commit: Mapping[str, Any] | None = None) -> None:
        """Send the metrics of a commit this try made (:func:`~airflow_transactional.airflow.metrics.committed`:
        once per txid, from the try that committed it); ``took``: its Postgres transaction, seconds.
        A metric that cannot be sent never fails the task."""
        try:
            if commit is None:
                [commit] = coordinator.commits(self.topology_id, txid)
            st = coordinator.status(self.topology_id)
        except Exception:  # committed all the same
            self.log.warning("txid %d committed; its metrics were not sent", txid, exc_info=True)
            return
        metrics.committed(self.topology_id, txid=txid, duration_ms=took * 1000, records=commit["records_read"],
                          quarantined=commit["quarantined"], lag_records=st.lag, lag_seconds=st.lag_seconds,
                          build=st.build_progress)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """What OpenLineage hears when the task ends (:mod:`airflow_transactional.airflow.lineage`):
        the source it read, the outputs when it writes them, the run's transaction."""
        hook = TransactionalHook(self.transactional_conn_id)
        with hook.coordinator() as coordinator:
            txn = coordinator.transaction_for_run(self.topology_id, task_instance.run_id)
            commit = None
            if txn is not None and txn.committed:
                commit = next(iter(coordinator.commits(self.topology_id, txn.txid)), None)
            return lineage.operator_lineage(self.topology, hook.get_dsn(), coordinator.schema, txn, commit,
                                            writes=self.writes_outputs)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return self.get_openlineage_facets_on_complete(task_instance)

    @contextmanager
    def failing_for_good(self, coordinator: Coordinator, context: Mapping[str, Any], what: str) -> Iterator[None]:
        """Record a failed try with its reason in one line (the status shows it even when no attempt
        was registered); on the last try, the failure for good, so later commits fail fast (trap 2).
        A configuration the task cannot run with fails for good at once: a retry would meet it again."""
        try:
            yield
        except NotYourTurn:  # not a failure: the task waits for its turn
            raise
        except Exception as exc:
            reason = f"{self.task_id}: {failure_reason(what, exc)}"
            self.log.error("%s", reason)  # the last line of the log says what happened, in one line
            for_good = isinstance(exc, ConfigError) or int(context["ti"].try_number) > int(self.retries or 0)
            txn = coordinator.transaction_for_run(self.topology_id, context["run_id"])
            if txn is not None and not txn.committed:
                coordinator.note_failed_try(self.topology_id, txn.txid, reason)
                if for_good:
                    coordinator.mark_failed(self.topology_id, txn.txid, reason)
            if isinstance(exc, ConfigError):
                raise AirflowFailException(reason) from exc
            raise


class WaitingTask(TopologyTask):
    """A task that may have to wait for its turn (the plan for a slot, the commit for txid-1).

    A short wait stays in the worker, polling every ``poll_interval`` seconds: most waits of a
    pipeline are a commit whose predecessor commits a moment later, and resuming a deferred task
    costs Airflow a few seconds. Once the wait has lasted ``defer_after``, with
    ``deferrable=True`` (the default) it is handed to Airflow's triggerer
    (:class:`~airflow_transactional.airflow.triggers.TurnTrigger`): it holds no worker slot any more,
    shows as *deferred* in the grid, and wakes as soon as the topology commits.
    ``deferrable=False`` polls in the worker to the end. The fail-fast rules
    (:class:`~airflow_transactional.airflow.watch.Watch`) are the same either way.
    """

    #: How long a wait may last, and how often the worker looks, unless the DAG says otherwise.
    default_wait_timeout: ClassVar[timedelta]
    default_poll_interval: ClassVar[float]
    #: Whether the trigger of a deferred wait does the work itself when the turn comes (a commit).
    commits_in_triggerer: ClassVar[bool] = False

    def __init__(self, *, deferrable: bool = True, defer_after: timedelta = timedelta(seconds=10),
                 wait_timeout: timedelta | None = None, poll_interval: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.defer_after = defer_after
        self.wait_timeout = wait_timeout or self.default_wait_timeout
        self.poll_interval = poll_interval or self.default_poll_interval

    def execute(self, context: Any) -> dict[str, Any]:
        return self.take_turn(context, deadline=self.deadline(), fresh=True)

    def resume(self, context: Any, event: dict[str, Any], deadline: float) -> dict[str, Any]:
        """Back from the triggerer: take the turn, fail if it never comes, else wait on."""
        if event.get("status") == "blocked":
            self.fail_blocked(context, str(event["reason"]))
        return self.take_turn(context, deadline=deadline, fresh=False, may_wait=event.get("status") != "timeout")

    @abstractmethod
    def take_turn(self, context: Any, *, deadline: float, fresh: bool, may_wait: bool = True) -> dict[str, Any]:
        """Do the task's work once its turn has come (waiting for it, see :meth:`wait_turn`);
        ``fresh``: a new try (not one resumed from the triggerer)."""

    def fail_blocked(self, context: Any, reason: str, coordinator: Coordinator | None = None) -> NoReturn:
        """Fail the task: what it waits for will never come (``reason`` says why and what to do)."""
        metrics.blocked(self.topology_id)
        raise AirflowFailException(reason)

    def wait_turn(self, coordinator: Coordinator, context: Any, attempt: Callable[[], T], *, deadline: float,
                  may_wait: bool) -> T:
        """``attempt()`` once it no longer raises :class:`NotYourTurn`: polling every ``poll_interval``
        in the worker, after ``defer_after`` in the triggerer; failing fast (after ``blocked_grace``)
        when an earlier txid failed for good, and after ``deadline`` at the latest."""
        watch = self.watch(context)
        said = None
        since = time.monotonic()
        while True:
            try:
                return attempt()
            except NotYourTurn as exc:
                if not may_wait or time.time() > deadline:
                    raise
                if str(exc) != said:  # say it once per change, not every poll
                    said = str(exc)
                    self.log.info("%s; waiting", exc)
                if self.time_to_defer(since):
                    self.wait_in_triggerer(context, deadline=deadline, waiting_for=exc.waiting_for,
                                           **exc.trigger_args)  # type: ignore[arg-type]
                blocked = watch.still_blocked(coordinator, exc.blocked_from)
                if blocked:
                    self.fail_blocked(context, blocked, coordinator)
                time.sleep(self.poll_interval)

    def time_to_defer(self, waiting_since: float) -> bool:
        """Whether a wait that began at ``waiting_since`` (monotonic) moves to the triggerer now."""
        return self.deferrable and time.monotonic() - waiting_since >= self.defer_after.total_seconds()

    def deadline(self) -> float:
        """When a wait starting now gives up (seconds since the epoch: it may resume elsewhere)."""
        return time.time() + self.wait_timeout.total_seconds()

    def watch(self, context: Mapping[str, Any]) -> Watch:
        """The fail-fast rules for this task's wait, asking Airflow through this task instance."""
        return Watch(self.topology_id, lambda run_id: self.airflow_run_state(context, run_id),
                     blocked_grace=self.blocked_grace.total_seconds(), check_interval=self.airflow_check_interval,
                     log=self.log)

    def airflow_run_state(self, context: Mapping[str, Any], run_id: str) -> str | None:
        """Airflow's state of this DAG's run ``run_id``; :data:`DELETED` when Airflow has no such
        run, None when it cannot say (no task instance at hand, the API away for a moment)."""
        ti = context.get("ti")
        if ti is None:
            return None
        return run_state(lambda: ti.get_dagrun_state(dag_id=ti.dag_id, run_id=run_id), run_id, self.log)

    def wait_in_triggerer(self, context: Mapping[str, Any], *, deadline: float, waiting_for: str,
                          txid: int = 0, in_flight: list[int] | None = None) -> NoReturn:
        """Defer to the triggerer until it is worth looking again; Airflow then calls ``resume``."""
        trigger = TurnTrigger(conn_id=self.transactional_conn_id, topology_id=self.topology_id,
                              dag_id=context["ti"].dag_id, waiting_for=waiting_for, deadline=deadline, txid=txid,
                              in_flight=in_flight, blocked_grace=self.blocked_grace.total_seconds(),
                              check_interval=self.airflow_check_interval, commit=self.commits_in_triggerer)
        self.defer(trigger=trigger, method_name="resume", kwargs={"deadline": deadline})
