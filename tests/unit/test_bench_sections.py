"""The benchmark's sections, one module each: ``bench/sections/<name>.py`` for every name
``--only`` takes, and no module that is not a section; each says which section it is."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench import perf

pytestmark = pytest.mark.unit

SECTIONS = Path(perf.__file__).parent / "sections"


def test_every_section_is_one_module_of_its_name_and_says_so() -> None:
    modules = {p.stem for p in SECTIONS.glob("*.py")} - {"__init__"}
    assert modules == set(perf.SECTIONS)
    for name in perf.SECTIONS:
        doc = ast.get_docstring(ast.parse((SECTIONS / f"{name}.py").read_text())) or ""
        assert doc.startswith(f"The ``{name}`` section of ``bench.perf``"), (name, doc[:80])
