"""The lag of a source that must ask another server (a Kafka cluster), as statuses show it.

Every view of a topology -- the UI's overview and pages, the commit's metrics, the stall watch,
``airflow-txn status`` -- reads its status, and a status shows the lag. Asked of a broker that
does not answer, that took 30 s per Kafka topology, in sequence, with a database transaction open
throughout; a connection whose settings the client refused broke the whole overview. So a remote
lag is asked outside any transaction, on a daemon thread, waited for :data:`WAIT` seconds at most
(the thread goes on, and its answer is kept), and any failure is an answer too -- "unknown", with
why -- kept for :data:`KEEP` seconds like a good one: a broken cluster costs each view a few
seconds once, then nothing, and never hides the other topologies.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import NamedTuple

from ..connections import redact
from ..exceptions import TransactionalError
from ..model import Offsets
from ..sources.base import Source

#: Seconds a status waits for a remote lag before it says "unknown" (the question goes on).
WAIT = 3.0
#: Seconds a check that can afford it waits (the stall watch): past the client's own timeouts, so
#: an "unknown" it sees is the server's failure, not its slowness.
PATIENT = 45.0
#: Seconds an answer (a lag, or why there is none) is reused for the same source and offsets.
KEEP = 15.0


class Lag(NamedTuple):
    """Records past the committed offsets, the oldest one's age, and why they are unknown (then
    ``records`` is 0 and ``seconds`` None)."""

    records: int
    seconds: float | None
    unknown: str | None = None
    bytes: int | None = None  # what the waiting records hold, where the source says (files on S3 or HDFS)


_lock = threading.Lock()
_answers: dict[str, tuple[float, Lag]] = {}
_asking: dict[str, tuple[float, Future[Lag]]] = {}  # when each question began


def remote(source: Source, topology_id: str, committed: Offsets, *, wait: float | None = None) -> Lag:
    """The lag of ``source`` (a :attr:`~..sources.base.Source.remote` one) past ``committed``:
    an answer at most :data:`KEEP` seconds old if there is one, else the one asked for now --
    waited for until ``wait`` seconds (default :data:`WAIT`) after the question began."""
    wait = WAIT if wait is None else wait
    key = json.dumps([topology_id, source.to_config(), committed], sort_keys=True, default=str)
    with _lock:
        kept = _answers.get(key)
        if kept is not None and time.monotonic() - kept[0] < KEEP:
            return kept[1]
        began, asking = _asking.get(key) or (time.monotonic(), None)
        if asking is None:
            asking = Future()
            _asking[key] = (began, asking)
            threading.Thread(target=_ask, args=(key, source, committed, asking), daemon=True,
                             name=f"txn-lag-{topology_id}").start()
    try:  # a question an earlier view began is waited for only what is left of ``wait`` since then
        return asking.result(timeout=max(0.0, wait - (time.monotonic() - began)))
    except FutureTimeout:
        return Lag(0, None, f"the source has not answered for {time.monotonic() - began:.0f} s (still asking; a "
                            "later view shows its answer)")


def _ask(key: str, source: Source, committed: Offsets, asking: Future[Lag]) -> None:
    try:
        records, seconds = source.remote_lag(committed)
        answer = Lag(int(records), seconds)
    except Exception as exc:  # any failure is an answer: the lag is unknown, and why
        text = str(exc).strip()
        answer = Lag(0, None, redact(text if isinstance(exc, TransactionalError) and text else
                                     f"{type(exc).__name__}: {text}").strip())
    with _lock:
        _answers[key] = (time.monotonic(), answer)
        _asking.pop(key, None)
        for old in [k for k, (at, _a) in _answers.items() if time.monotonic() - at > 10 * KEEP]:
            del _answers[old]
    asking.set_result(answer)


def forget() -> None:
    """Drop every kept answer (tests; a process that changed a connection)."""
    with _lock:
        _answers.clear()
