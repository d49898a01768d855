"""Waits that hold no worker slot: a commit waiting for txid-1, a plan waiting for an in-flight
slot, parked in Airflow's triggerer instead of sleeping in a worker.

The trigger wakes at once when its topology commits a txid or records one as failed for good
(``LISTEN`` on :data:`~airflow_transactional.store.notices.CHANNEL`; the commit's own transaction
sends the notice), and looks again every ``check_interval`` seconds in any case, so a lost
notice or listener costs latency, never correctness. It keeps every fail-fast rule of a task
waiting in a worker (:class:`~airflow_transactional.airflow.watch.Watch`): blocked by a failed
txid, a run killed on its last try, a deleted run. A plan's trigger only says when to look again:
the task resumes in a worker and plans. A commit's trigger (``commit=True``) also commits the txid
the moment its turn comes -- the commit is one PostgreSQL transaction that any process may run, at
most once -- so its state is visible without waiting for Airflow to resume the task (a second or
more); the task then resumes to find it committed and tells the platform (asset events, metrics).
Any error of that commit leaves it to the task, which commits with every check a task makes.

One ``LISTEN`` connection per triggerer process and state-store database serves every trigger
there; each trigger holds one more connection for its own checks. Their blocking work (a look at
the store, a commit) runs on threads of the provider's own (:data:`THREADS`), never on the event
loop's default executor that every trigger of the triggerer shares: a commit kept waiting by a lock
(bounded: :data:`~airflow_transactional.store.outputs.LOCK_WAIT`) holds none of another
provider's threads. Airflow is asked about a predecessor's run on those threads too, beside the
look, never inside it: the triggerer relays that question through its supervisor, which can take
seconds, and a commit whose turn came meanwhile goes ahead without the answer.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg2.extensions
from airflow.triggers.base import BaseTrigger, TriggerEvent

from ..connections import CONNECTION_ERRORS, redact
from ..coordinator import Coordinator
from ..model import one_line
from ..store import notices
from ..store.connection import connect
from .hooks import TransactionalHook
from .watch import Watch, run_state

log = logging.getLogger(__name__)

#: The threads the provider's triggers run their blocking work on (see the module's docstring).
THREADS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="airflow-txn-trigger")
T = TypeVar("T")


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on one of :data:`THREADS` (with this task's context, as ``asyncio.to_thread``)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(THREADS, call)


#: What a trigger waits for.
COMMIT = "commit"  # txid-1 to commit
SLOT = "slot"  # the set of uncommitted txids to change (a commit frees a max_in_flight slot)


class TurnTrigger(BaseTrigger):
    """Fires once the waiting task should look again: ``{"status": "turn"}`` (its turn may have
    come), ``{"status": "committed", ...}`` (``commit``: its turn came and the trigger committed
    the txid: ``committed`` whether this commit did, ``took`` its seconds), ``{"status":
    "blocked", "reason": ...}`` (it never will: fail), or ``{"status": "timeout"}`` (``deadline``,
    seconds since the epoch, passed).

    ``waiting_for`` is :data:`COMMIT` (``txid`` waits for every lower txid to commit) or
    :data:`SLOT` (a plan saw the uncommitted txids ``in_flight`` and waits for that to change,
    or for one of their runs to be deleted so it can take that batch over).
    """

    def __init__(self, *, conn_id: str, topology_id: str, dag_id: str, waiting_for: str, deadline: float,
                 txid: int = 0, in_flight: list[int] | None = None, blocked_grace: float = 30.0,
                 check_interval: float = 5.0, commit: bool = False) -> None:
        super().__init__()
        if waiting_for not in (COMMIT, SLOT):
            raise ValueError(f"waiting_for must be {COMMIT!r} or {SLOT!r}, got {waiting_for!r}")
        self.conn_id = conn_id
        self.topology_id = topology_id
        self.dag_id = dag_id
        self.waiting_for = waiting_for
        self.deadline = deadline
        self.txid = txid
        self.in_flight = list(in_flight or [])
        self.blocked_grace = blocked_grace
        self.check_interval = check_interval
        self.commit = commit and waiting_for == COMMIT

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "conn_id": self.conn_id, "topology_id": self.topology_id, "dag_id": self.dag_id,
            "waiting_for": self.waiting_for, "deadline": self.deadline, "txid": self.txid,
            "in_flight": self.in_flight, "blocked_grace": self.blocked_grace,
            "check_interval": self.check_interval, "commit": self.commit})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = TransactionalHook(self.conn_id)
        coordinator = await blocking(hook.coordinator)  # Airflow's connections: a commit's outputs
        owner = await blocking(self._owner, coordinator)
        if owner != self.dag_id:  # a trigger names its topology: only that topology's DAG may wait on it
            await blocking(coordinator.close)
            yield TriggerEvent({"status": "blocked", "reason": (
                f"topology {self.topology_id!r} is run by DAG {owner!r}, not by DAG {self.dag_id!r}: a task waits "
                "for (and commits) the txids of its own DAG's topology only")})
            return
        watch = Watch(self.topology_id, self._run_state, blocked_grace=self.blocked_grace,
                      check_interval=self.check_interval, log=self.log, asks_on=THREADS)
        try:
            async with notified(coordinator.dsn, coordinator.schema, self.topology_id) as woken:
                while True:
                    await woken.listen()  # again, if the listener lost its connection
                    woken.clear()  # a notice from here on wakes the wait below
                    try:
                        event = await blocking(self.look, coordinator, watch)
                    except CONNECTION_ERRORS as exc:  # the store restarting: look again, do not fail the task
                        self.log.warning("cannot look at the state store (%s); trying again", redact(str(exc)))
                        event = None
                    if event is None and time.time() >= self.deadline:
                        event = {"status": "timeout"}
                    if event is not None:
                        yield TriggerEvent(event)
                        return
                    try:
                        await asyncio.wait_for(woken.wait(), timeout=self.check_interval)
                    except TimeoutError:
                        pass
        finally:
            await blocking(coordinator.close)

    def _owner(self, coordinator: Coordinator) -> str | None:
        """The DAG that runs the trigger's topology (None: no such topology, or the store is away --
        then the waits below find out and say so)."""
        try:
            return coordinator.spec(self.topology_id).dag
        except Exception:
            return self.dag_id

    def look(self, coordinator: Coordinator, watch: Watch) -> dict[str, Any] | None:
        """One look at the state store (and at Airflow, every ``check_interval``): the event to
        fire, or None to go on waiting. Blocking calls: run in a thread."""
        if self.waiting_for == COMMIT:
            if coordinator.first_pending(self.topology_id, self.txid) is None:
                return self.committed(coordinator) if self.commit else {"status": "turn"}
            blocked = watch.still_blocked(coordinator, self.txid)
        else:
            planned = coordinator.planned_runs(self.topology_id)
            if [p.txid for p in planned] != self.in_flight or watch.deleted_runs(planned):
                return {"status": "turn"}
            blocked = watch.still_blocked(coordinator, max(self.in_flight, default=0) + 1)
        return {"status": "blocked", "reason": blocked} if blocked else None

    def committed(self, coordinator: Coordinator) -> dict[str, Any]:
        """Commit the txid whose turn came (blocking: in a thread): the event that says so, or
        ``turn`` when the commit failed -- the task then commits, and records a failure as a
        task does."""
        began = time.monotonic()
        try:
            result = coordinator.commit(self.topology_id, self.txid)
        except Exception as exc:
            self.log.warning("txid %d: committing in the triggerer failed (%s); the task commits when it resumes",
                             self.txid, redact(one_line(str(exc)) or type(exc).__name__))
            return {"status": "turn"}
        self.log.info("%s", result.message)
        return {"status": "committed", "txid": result.txid, "committed": result.committed,
                "took": time.monotonic() - began}

    def _run_state(self, run_id: str) -> str | None:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        return run_state(lambda: RuntimeTaskInstance.get_dagrun_state(dag_id=self.dag_id, run_id=run_id),
                         run_id, self.log)


class _Listener:
    """One ``LISTEN`` connection of this process to one database, set on the event loop's reader."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg2.extensions.connection | None = None
        self.waiters: dict[tuple[str, str], set[Woken]] = {}
        self.lock = asyncio.Lock()
        self.warned = False

    async def ensure(self) -> None:
        """Listening, unless the database cannot be reached now (then the triggers poll)."""
        async with self.lock:
            if self.conn is not None:
                return
            try:
                conn = await blocking(self._connect)
            except Exception as exc:
                if not self.warned:
                    log.warning("not listening for commits (%s): waits poll every few seconds instead",
                                redact(str(exc)))
                    self.warned = True
                return
            self.conn, self.warned = conn, False
            asyncio.get_running_loop().add_reader(conn.fileno(), self._readable)

    def _connect(self) -> psycopg2.extensions.connection:
        conn = connect(self.dsn, application_name="airflow_transactional listener")
        conn.autocommit = True
        with conn.cursor() as cur:
            notices.listen(cur)
        return conn

    def _readable(self) -> None:
        conn = self.conn
        if conn is None:
            return
        try:
            conn.poll()
        except psycopg2.Error as exc:
            log.warning("the commit listener lost its connection (%s); reconnecting", redact(str(exc)))
            self.close()
            for events in self.waiters.values():  # look now, and listen again on the next round
                for event in events:
                    event.set()
            return
        while conn.notifies:
            notice = notices.parse(conn.notifies.pop(0).payload)
            if notice is not None:
                for event in self.waiters.get((notice.schema, notice.topology_id), ()):
                    event.set()

    def close(self) -> None:
        if self.conn is not None:
            try:
                asyncio.get_running_loop().remove_reader(self.conn.fileno())
            except (RuntimeError, ValueError, psycopg2.Error):
                pass
            self.conn.close()
            self.conn = None


_LISTENERS: dict[tuple[int, str], _Listener] = {}


class Woken(asyncio.Event):
    """Set whenever the topology commits a txid or records a failure."""

    def __init__(self, listener: _Listener) -> None:
        super().__init__()
        self._listener = listener

    async def listen(self) -> None:
        """Make sure the process listens (reconnecting after a lost connection)."""
        await self._listener.ensure()


@asynccontextmanager
async def notified(dsn: str, schema: str, topology_id: str) -> AsyncIterator[Woken]:
    """A :class:`Woken` event for ``topology_id`` in ``schema``, fed by this process's listener."""
    key = (id(asyncio.get_running_loop()), dsn)
    listener = _LISTENERS.setdefault(key, _Listener(dsn))
    event = Woken(listener)
    listener.waiters.setdefault((schema, topology_id), set()).add(event)
    try:
        yield event
    finally:
        waiting = listener.waiters.get((schema, topology_id), set())
        waiting.discard(event)
        if not waiting:
            listener.waiters.pop((schema, topology_id), None)
        if not listener.waiters:
            listener.close()
            _LISTENERS.pop(key, None)
