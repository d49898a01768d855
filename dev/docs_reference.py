"""An MkDocs hook (``mkdocs.yml``): the reference pages generated from the code, so they cannot
drift from it. ``<!-- reference:python -->`` becomes every public name of ``airflow_transactional``
and of ``airflow_transactional.spark_job`` (what a DAG file and a job file import) with its
signature and docstring; ``<!-- reference:cli -->`` becomes every ``airflow-txn`` command with its
arguments, as its argparse definition says them; ``<!-- reference:metrics -->`` the metrics'
table of ``airflow/metrics.py``; ``<!-- reference:schema -->`` every table of the state store, as
its baseline schema file creates it."""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

MARKER = re.compile(r"<!-- reference:([a-z]+) -->")
#: The modules whose public names (``__all__``) a user imports.
MODULES = ("airflow_transactional", "airflow_transactional.spark_job")
STARS: dict[inspect._ParameterKind, str] = {inspect.Parameter.VAR_POSITIONAL: "*",
                                            inspect.Parameter.VAR_KEYWORD: "**"}


def _signature(name: str, obj: Any) -> str:
    """``name(`` one parameter a line ``)``, annotations as written in the code."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    params, star = [], False
    for param in sig.parameters.values():
        if param.kind is param.KEYWORD_ONLY and not star:
            params.append("*")
            star = True
        star = star or param.kind is param.VAR_POSITIONAL
        text = STARS.get(param.kind, "") + param.name
        if param.annotation is not param.empty:
            hint = param.annotation
            text += f": {hint if isinstance(hint, str) else inspect.formatannotation(hint)}"
        if param.default is not param.empty:
            text += f" = {param.default!r}"
        params.append(text)
    returns = "" if sig.return_annotation is sig.empty else f" -> {sig.return_annotation}"
    if not params:
        return f"{name}(){returns}"
    return f"{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){returns}"


def public_names() -> list[tuple[str, str, Any]]:
    """(module, name, object) of every public name of :data:`MODULES`, in ``__all__`` order."""
    out = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        out += [(module_name, name, getattr(module, name)) for name in module.__all__]
    return out


def python() -> str:
    parts = []
    for module_name, name, obj in public_names():
        kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "constant"
        parts.append(f"## `{name}`\n\n*{kind}*, `from {module_name} import {name}`\n")
        if callable(obj):
            parts.append(f"```python\n{_signature(name, obj)}\n```\n")
        else:
            parts.append(f"```python\n{name} = {obj!r}\n```\n")
        doc = inspect.getdoc(obj) if callable(obj) else None
        if doc:
            parts.append(doc + "\n")
    return "\n".join(parts)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli() -> str:
    from airflow_transactional.cli import parser

    os.environ["COLUMNS"] = "100"  # argparse wraps its help to the terminal's width: the page's, here
    top = parser()
    parts = [f"```\n{top.format_help()}```\n"]
    for name, sub in subcommands(top).items():
        parts.append(f"## `airflow-txn {name}`\n\n```\n{sub.format_help()}```\n")
    return "\n".join(parts)


def metrics() -> str:
    """The metrics module's docstring: the one table of every name the code sends (the docs test
    checks each name sent in ``metrics.py`` is in it)."""
    from airflow_transactional.airflow import metrics as module

    doc = inspect.getdoc(module) or ""
    rows = re.search(r"^(=+  =+  =+)\n(.*?)\n\1$", doc, re.S | re.M)
    if rows is None:
        raise ValueError("airflow/metrics.py's docstring has no table of metrics (rst: ===  ===  ===)")
    table = "| metric | kind | what |\n| --- | --- | --- |\n"
    for line in rows.group(2).splitlines():
        if line[:2] == "``":
            name, kind, text = re.match(r"``(\w+)``\s+(\w+)\s+(.*)", line).groups()  # type: ignore[union-attr]
            table += f"| `{name}` | {kind} | {text} |\n"
        else:  # a row's text going on
            table = table[:-3] + f" {line.strip()} |\n"
    head, tail = doc[:rows.start()].strip(), doc[rows.end():].strip()
    text = f"{head}\n\n{table}\n{tail}\n".replace("``", "`")
    return re.sub(r":mod:`([^`]+)`", r"`\1`", text)


def schema() -> str:
    """Every table of the state store, as the schema's baseline file creates it, with its comment."""
    from airflow_transactional.store import migrations

    sql = (Path(migrations.__file__).parent / "schema" / "0001_baseline.sql").read_text()
    parts: list[str] = []
    comment: list[str] = []
    statement: list[str] | None = None
    for line in sql.splitlines():
        if statement is not None:  # inside a CREATE TABLE, up to its closing line
            statement.append(line)
            if line.startswith(");"):
                table = statement[0].split()[2].split(".")[-1]
                body = "\n".join(statement).replace("{s}", "airflow_txn").replace("{{", "{").replace("}}", "}")
                parts.append(f"## `{table}`\n\n{' '.join(comment)}\n\n```sql\n{body}\n```\n")
                statement, comment = None, []
        elif line.startswith("CREATE TABLE "):
            statement = [line]
        elif line.startswith("--"):
            comment.append(line[2:].strip())
        else:
            comment = []
    return "\n".join(parts)


RENDERERS: dict[str, Callable[[], str]] = {"python": python, "cli": cli, "metrics": metrics, "schema": schema}


def render(name: str) -> str:
    if name not in RENDERERS:
        raise ValueError(f"no reference:{name}: one of {', '.join(sorted(RENDERERS))}")
    return RENDERERS[name]()


def on_page_markdown(markdown: str, **_kwargs: Any) -> str:
    return MARKER.sub(lambda m: render(m.group(1)), markdown)
