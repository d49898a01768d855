"""Rebuild a topology's states from its source while it keeps committing, then swap atomically
(``airflow-txn rebuild``). The protocol is :mod:`airflow_transactional.core.rebuild`; these are
its calls on a :class:`~airflow_transactional.coordinator.Coordinator`."""

from __future__ import annotations

from typing import Any

from .coordinator import Coordinator
from .core import rebuild as _core
from .core.rebuild import Rebuild
from .exceptions import RebuildInProgress

__all__ = ["Rebuild", "RebuildInProgress", "abort", "begin", "load_copies", "swap"]


def begin(coordinator: Coordinator, topology_id: str) -> Rebuild:
    """Mark the rebuild's starting point (T0, the committed txid) and take its liveness lock."""
    return _core.begin(coordinator.store, topology_id)


def load_copies(coordinator: Coordinator, topology_id: str) -> dict[str, str]:
    """The COPY statement that loads each state's recomputation, by state name."""
    return _core.load_copies(coordinator.store, topology_id)


def swap(coordinator: Coordinator, rebuild: Rebuild) -> dict[str, Any]:
    """Replay the journal onto the recomputed states and swap them in, in one transaction."""
    return _core.swap(coordinator.store, rebuild)


def abort(coordinator: Coordinator, topology_id: str, *, rebuild: Rebuild | None = None, force: bool = False) -> bool:
    """Forget a rebuild that did not finish (a live one only with ``force``); False: none to abort."""
    return _core.abort(coordinator.store, topology_id, rebuild=rebuild, force=force)
