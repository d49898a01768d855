"""Named fault points: the places in the protocol worth breaking -- ``commit.after_apply``,
``spark.begin``, ``append.before_commit`` and the others the code calls :func:`point` at.

In production a point costs one check of a module global and does nothing. The crash-point tests
and the chaos harness install a fault engine when a process starts, by naming its module in
``AIRFLOW_TXN_FAULT_ENGINE`` (the engine lives with the tests, in the repository's ``dev/``, and is
never installed with the provider); it decides at each point whether to kill the process, drop
the connection, raise or wait.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

ENGINE_ENV = "AIRFLOW_TXN_FAULT_ENGINE"

#: An engine: called with (point name, the point's cursor or None, its scope).
Engine = Callable[[str, Any, tuple[str, ...]], None]

_engine: Engine | None = None


def point(name: str, cur: Any = None, *, scope: tuple[str, ...] = ()) -> None:
    """A place where a fault may be injected; ``scope`` narrows it (``spark.begin:words:7``)."""
    if _engine is not None:
        _engine(name, cur, scope)


def install(engine: Engine | None) -> None:
    """Install a fault engine in this process (None: none)."""
    global _engine
    _engine = engine


def _install_from_env() -> None:
    module = os.environ.get(ENGINE_ENV)
    if module:
        install(importlib.import_module(module).point)


_install_from_env()
