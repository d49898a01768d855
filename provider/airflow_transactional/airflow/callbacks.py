"""A user's callback given as a function or its dotted path (``on_late_commit``, ``on_stall``),
imported at DAG-parse time so that a wrong path is refused with the fix, not when it would fire."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ..exceptions import ConfigError


def imported(callback: Callable[..., Any] | str, *, setting: str, kind: str, where: str) -> Any:
    """``callback`` itself, or what its dotted path names; a path that does not import is refused
    naming ``setting``, the ``kind`` of function wanted and ``where`` it must import."""
    if not isinstance(callback, str):
        return callback
    module, _, attr = callback.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr) if module and attr else None
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{setting} {callback!r} cannot be imported ({exc}): give the dotted path of {kind} "
                          f"importable where {where}, e.g. 'my_alerts.page_on_call'") from None
