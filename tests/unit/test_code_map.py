"""The code map (docs/contributing/code-map.md) matches the tree: every module of the package is
named in it, and every path it names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "provider" / "airflow_transactional"
MAP = (REPO / "docs" / "contributing" / "code-map.md").read_text()


def _named() -> set[str]:
    """The paths the map names in backticks, whole (``spark/job.py``, ``bench/perf.py``, ``core/``)."""
    return set(re.findall(r"`([\w/]+(?:\.py|\.sql|/))`", MAP))


def test_every_module_of_the_package_is_on_the_code_map() -> None:
    named = _named()
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    missing = sorted(m for m in modules if m not in named)
    assert len(modules) > 80 and missing == []


def test_every_path_on_the_code_map_exists() -> None:
    gone = sorted(p for p in _named() if not (PACKAGE / p).exists() and not (REPO / p).exists()
                  and not (REPO / "docs" / p).exists())
    assert gone == []
