"""Every cross-reference in the package's docstrings names something that exists.

A module moved or a function renamed leaves ``:func:`..old.name``` behind, and nothing else
notices: the generated reference renders it as plain text, and a reader follows it nowhere. A
reference resolves the way a reader of the module would look it up: a leading ``.`` or ``..`` from
the module's own package, as a relative import does; otherwise a name the module holds (defined or
imported), then a module or name under the module's package, then under ``airflow_transactional``,
then an absolute import; ``~`` only shortens how it is shown. ``X.y`` inside a class means a member
of ``X``; a bare ``y`` may also be a member of a class of the module (a method naming its sibling,
an attribute ``self.y`` its class sets).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType
from typing import Any

import airflow_transactional

ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc|obj):`([^`<>]+?)`")


def _modules() -> list[ModuleType]:
    names = [m.name for m in pkgutil.walk_packages(airflow_transactional.__path__, "airflow_transactional.")]
    return [airflow_transactional, *(importlib.import_module(n) for n in names)]


def _walk(obj: Any, dotted: str) -> bool:
    """Whether ``dotted`` names an attribute chain of ``obj``, importing submodules on the way."""
    for part in dotted.split("."):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        if isinstance(obj, ModuleType):
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")
                continue
            except ImportError:
                return False
        return False
    return True


def _package(module: ModuleType) -> ModuleType:
    if hasattr(module, "__path__"):
        return module
    return importlib.import_module(module.__name__.rpartition(".")[0])


def resolves(module: ModuleType, ref: str) -> bool:
    ref = ref.lstrip("~")
    if ref.startswith("."):
        dots = len(ref) - len(ref.lstrip("."))
        base = _package(module).__name__.split(".")
        if dots - 1 >= len(base):
            return False
        anchor = importlib.import_module(".".join(base[:len(base) - (dots - 1)]))
        return _walk(anchor, ref[dots:]) if ref[dots:] else True
    classes = [cls for _, cls in inspect.getmembers(module, inspect.isclass) if cls.__module__ == module.__name__]
    if any(_walk(c, ref) for c in [module, _package(module), airflow_transactional, *classes]):
        return True
    if any(re.search(rf"\bself\.{re.escape(ref)}\s*[:=]", inspect.getsource(c)) for c in classes):
        return True  # an instance attribute its class sets
    head, _, rest = ref.partition(".")
    try:
        top = importlib.import_module(head)
    except ImportError:
        return False
    return _walk(top, rest) if rest else True


def unresolved() -> list[str]:
    bad = []
    for module in _modules():
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            continue
        for n, line in enumerate(source.splitlines(), 1):
            for ref in ROLE.findall(line):
                if not resolves(module, ref):
                    bad.append(f"{module.__name__}:{n}: {ref}")
    return bad


def test_every_docstring_reference_names_something_that_exists() -> None:
    assert unresolved() == []


def test_a_stale_reference_is_caught() -> None:
    from airflow_transactional.spark import admit

    assert resolves(admit, "..limits.MAX_RECORD_BYTES")
    assert not resolves(admit, "..limits.MAX_RECORD_BYTE")
    assert not resolves(admit, "..deadlines")
    assert resolves(admit, "first_reason") and not resolves(admit, "first_reasons")


def test_every_parameter_of_transactional_dag_has_one_param_line_in_signature_order() -> None:
    """The reference shows them as one table (dev/docs_reference.py): a parameter added without
    its line, or documented twice, fails here."""
    import inspect

    from airflow_transactional.airflow.dag import transactional_dag
    from dev.docs_reference import PARAM, param_table

    doc = inspect.getdoc(transactional_dag) or ""
    documented = [m.group(1) for m in map(PARAM.match, doc.splitlines()) if m]
    assert documented == list(inspect.signature(transactional_dag).parameters)
    table = param_table(doc)
    assert ":param" not in table and table.count("\n| `") == len(documented)
