"""An MkDocs hook (``mkdocs.yml``): the reference pages generated from the code, so they cannot
drift from it. ``<!-- reference:python -->`` becomes every public name of ``airflow_transactional``
and of ``airflow_transactional.spark_job`` (what a DAG file and a job file import) with its
signature and docstring; ``<!-- reference:cli -->`` becomes every ``airflow-txn`` command with its
arguments, as its argparse definition says them; ``<!-- reference:metrics -->`` the metrics'
table of ``airflow/metrics.py``; ``<!-- reference:schema -->`` every table of the state store, as
its migration files make it; ``<!-- reference:connections -->`` every Airflow connection the
provider reads, the parameters that name one (found in the public signatures: a new ``*conn_id``
parameter without an entry here fails the build) and the fields and extras each uses, from the
allow-lists in the code."""

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
            parts.append(param_table(doc) + "\n")
    return "\n".join(parts)


PARAM = re.compile(r"^:param (\*{0,2}\w+): ?(.*)$")


def param_table(doc: str) -> str:
    """A docstring with its ``:param name: text`` lines (each text going on in the lines indented
    under it) as one table of parameter and what it does, where the first of them was."""
    lines: list[str] = []
    rows: list[list[str]] = []
    at: int | None = None
    for line in doc.splitlines():
        found = PARAM.match(line)
        if found:
            at = len(lines) if at is None else at
            rows.append([found.group(1), found.group(2)])
        elif rows and line.startswith("    ") and len(lines) == at:
            rows[-1][1] += " " + line.strip()
        else:
            lines.append(line)
    if not rows:
        return doc
    role = re.compile(r":\w+:`(~?)([^`]+)`")  # ~: the last part of the name only, as Sphinx shows it

    def code(found: re.Match[str]) -> str:
        return f"`{found.group(2).rsplit('.', 1)[-1] if found.group(1) else found.group(2)}`"

    table = ["| parameter | what it does |", "| --- | --- |"]
    table += [f"| `{name}` | {role.sub(code, text)} |" for name, text in rows]
    return "\n".join([*lines[:at], *table, "", *lines[at:]]).strip()


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
    """Every table of the state store, as its migration files make it, in order: a table's section
    has its CREATE TABLE with the comment above it, then each later migration's columns."""
    from airflow_transactional.store import migrations

    files = sorted((Path(migrations.__file__).parent / migrations.SCHEMA_DIR).glob("[0-9]*.sql"))
    tables: dict[str, list[str]] = {}
    for path in files:
        version = path.stem.split("_", 1)
        for table, comment, body in _statements(path.read_text()):
            if body.startswith("CREATE TABLE"):
                tables[table] = [f"## `{table}`\n\n{comment}\n\n```sql\n{body}\n```\n"]
            elif table in tables:
                tables[table].append(f"Since migration {int(version[0])} ({version[1].replace('_', ' ')}): "
                                     f"{comment}\n\n```sql\n{body}\n```\n")
    return "\n".join(part for parts in tables.values() for part in parts)


def _statements(sql: str) -> list[tuple[str, str, str]]:
    """(table, the comment above, the statement) of each CREATE TABLE and run of ALTER TABLEs of one
    table in a schema file (indexes and the rest are left out)."""
    out: list[tuple[str, str, str]] = []
    comment: list[str] = []
    statement: list[str] | None = None
    altering = False
    for line in sql.splitlines():
        if statement is not None:  # inside a CREATE TABLE, up to its closing line
            statement.append(line)
            if line.startswith(");"):
                out.append((statement[0].split()[2].split(".")[-1], " ".join(comment), _sql("\n".join(statement))))
                statement, comment = None, []
        elif line.startswith("CREATE TABLE "):
            statement = [line]
        elif line.startswith("ALTER TABLE "):  # a run of them shares the comment above it
            table = line.split()[2].split(".")[-1]
            if altering and out[-1][0] == table:
                out[-1] = (table, out[-1][1], f"{out[-1][2]}\n{_sql(line)}")
            else:
                out.append((table, " ".join(comment), _sql(line)))
            altering = True
        elif line.startswith("--"):
            comment.append(line[2:].strip())
        else:
            comment, altering = [], False
    return out


def _sql(text: str) -> str:
    return text.replace("{s}", "airflow_txn").replace("{{", "{").replace("}}", "}")


#: The connection each ``*conn_id`` parameter names: its type, and what the provider reads of it.
CONNECTION_KINDS = {"transactional_conn_id": "transactional", "verify_conn_id": "transactional",
                    "kafka_conn_id": "kafka", "spark_conn_id": "spark",
                    "spark_connect_conn_id": "spark_connect"}


def conn_parameters() -> dict[str, list[str]]:
    """``*conn_id`` parameter -> the public callables (and dataclass fields) that take it, with the default."""
    found: dict[str, list[str]] = {}
    for _module, name, obj in public_names():
        try:
            params = inspect.signature(obj).parameters.values() if callable(obj) else ()
        except (TypeError, ValueError):
            continue
        for param in params:
            if param.name.endswith("conn_id"):
                default = "" if param.default is param.empty else f"={param.default!r}"
                found.setdefault(param.name, []).append(f"`{name}({param.name}{default})`")
    return found


def _rows(pairs: list[tuple[str, str]]) -> str:
    return "| field or extra | how the provider uses it |\n| --- | --- |\n" + "".join(
        f"| {k} | {v} |\n" for k, v in pairs)


def _kafka_connection() -> str:
    from airflow_transactional.sources.kafka_settings import ALLOWED, GROUP_KEYS
    from airflow_transactional.spark.kafka import KAFKA_RENAMED, KAFKA_SAME, SASL_MODULES

    return ("The Apache Kafka provider's connection (type `kafka`): its extra holds librdkafka settings. The "
            "plan and the publisher use them with confluent-kafka; Spark's reader, a Java client, gets them through an "
            "allow-list.\n\n"
            + _rows([("extra `bootstrap.servers`", "required: the brokers to reach"),
                     *[(f"extra `{k}`", "passed to Spark's reader as `kafka." + k + "`") for k in KAFKA_SAME
                       if k != "bootstrap.servers"],
                     *[(f"extra `{k}`", f"passed to Spark's reader as `kafka.{java}` (the Java client's name)")
                       for k, java in KAFKA_RENAMED.items()],
                     ("extra `sasl.mechanism(s)`, `sasl.username`, `sasl.password`",
                      f"become Spark's JAAS line, for {', '.join(f'`{m}`' for m in SASL_MODULES)}"),
                     ("extra `ssl.ca.location`", "becomes a PEM truststore of Spark's reader"),
                     (", ".join(f"extra `{k}`" for k in sorted(GROUP_KEYS)), "ignored: the provider reads by offset, "
                      "never through a consumer group"),
                     ("the other `sasl.*` and `ssl.*` extras on the list", "used by the plan's and the publisher's "
                      "clients; a Spark job refuses them by name (its value never printed): Spark's reader has no "
                      "counterpart"),
                     ("the other extras on the allow-list: " + ", ".join(
                         f"`{k}`" for k in sorted(ALLOWED - GROUP_KEYS - set(KAFKA_SAME) - set(KAFKA_RENAMED)
                                                   - {"sasl.mechanism", "sasl.mechanisms", "sasl.username",
                                                      "sasl.password", "ssl.ca.location"})),
                      "used by the plan's and the publisher's clients, left out of Spark's reader"),
                     ("any extra off that list, and `plugin.library.paths`, `*.cmd`, `ssl.engine.*`, `ssl.providers`, "
                      "`*_cb` by name", "refused by name: whoever may edit the connection must not run code where the "
                      "provider runs; a value with a control character (a newline) is refused too")])
            + "\nOutside Airflow (the CLI, a test) the connection comes from `AIRFLOW_CONN_<ID>` in JSON; a Spark "
            "driver gets it inside its private DSN file.\n")


def connections() -> str:
    from airflow_transactional import UI_FIELD_BEHAVIOUR
    from airflow_transactional.airflow.hooks import ALLOWED_EXTRAS, TransactionalHook
    from airflow_transactional.model import DEFAULT_SCHEMA

    taken = conn_parameters()
    if unknown := set(taken) - set(CONNECTION_KINDS):
        raise ValueError(f"connection parameters {sorted(unknown)} have no entry in dev/docs_reference.py's "
                         "CONNECTION_KINDS: say which connection each names")
    placeholder = UI_FIELD_BEHAVIOUR["placeholders"]
    hook_doc = (TransactionalHook.__doc__ or "").strip().splitlines()[0]
    bodies = {
        "transactional": f"{hook_doc} Type `{TransactionalHook.conn_type}` (the "
        "provider's own form in the Airflow UI) or `postgres`; the *Test* button connects and reports the server.\n\n"
        + _rows([("host, port", f"the server (e.g. `{placeholder['host']}`, `{placeholder['port']}`)"),
                 ("schema", f"the database (the form calls it Database; e.g. `{placeholder['schema']}`)"),
                 ("login, password", "the role the tasks connect as (see the security guide's least-privilege "
                  "roles); the password reaches a Spark driver in a private file, never its command line"),
                 ("extra `state_schema`", f"the provider's schema in that database (default `{DEFAULT_SCHEMA}`)"),
                 *[(f"extra `{k}`", "passed to libpq as is") for k in ALLOWED_EXTRAS]])
        + "\nAny other extra is ignored: extras are never forwarded wholesale.\n",
        "kafka": _kafka_connection(),
        "spark": "The Apache Spark provider's connection (type `spark`) the process task submits with: its host is "
        "the master (`local[N]`, `spark://host:7077`, `yarn`, `k8s://https://host:443`), its extra `deploy-mode` "
        "client or cluster (the process task refuses cluster mode of a Python application on a standalone master "
        "before Spark would), `spark-binary`, `queue`, `namespace` as the provider documents them. What each master "
        "and mode supports: [Running on a cluster](../guides/cluster.md).\n",
        "spark_connect": "The Apache Spark provider's Spark Connect connection (type `spark_connect`): the "
        "process task runs the job as a client of that server instead of a `spark-submit` (host `sc://host`, "
        "port, login as `user_id`, password as `token`, extra `use_ssl`). The server needs the provider's "
        "Python dependencies, and Spark's Kafka connector in its `spark.jars` for a Kafka source.\n",
    }
    parts = []
    for param, kind in CONNECTION_KINDS.items():
        users = ", ".join(taken.get(param, [])) or "(no public parameter)"
        parts.append(f"## `{kind}`\n\nNamed by {users}.\n\n{bodies[kind]}")
    return "\n".join(parts)


RENDERERS: dict[str, Callable[[], str]] = {"python": python, "cli": cli, "metrics": metrics, "schema": schema,
                                           "connections": connections}


def render(name: str) -> str:
    if name not in RENDERERS:
        raise ValueError(f"no reference:{name}: one of {', '.join(sorted(RENDERERS))}")
    return RENDERERS[name]()


def on_page_markdown(markdown: str, **_kwargs: Any) -> str:
    return MARKER.sub(lambda m: render(m.group(1)), markdown)
