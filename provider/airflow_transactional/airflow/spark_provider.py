"""What the process task takes from the Spark provider beyond its public surface, in one place:
where a ``SparkSubmitHook``'s connection keeps its master and deploy mode, the ``spark-submit``
process it runs, and the loop that reads that process's output (and keeps its last lines for a
failed job's error); the ``SparkSubmitOperator``'s hook factory and deploy mode argument.

Each member used here is checked against the installed provider by
``tests/unit/test_spark_provider.py``; ``setup.cfg`` allows only the provider versions it was
checked on. A new provider version that moves one of them fails that test, not a topology.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

#: The members of ``SparkSubmitHook`` this module reads or replaces.
MEMBERS = ("_connection", "_submit_sp", "_last_submit_log_lines", "_process_spark_submit_log")
#: The members of ``SparkSubmitOperator`` the process task (its subclass) reads or overrides.
OPERATOR_MEMBERS = ("_get_hook", "_deploy_mode")


def deploy_mode_argument(operator: Any) -> str | None:
    """The ``deploy_mode`` the operator was given (None: the connection's)."""
    return operator._deploy_mode


def master_and_deploy_mode(hook: Any) -> tuple[str, str | None]:
    """The master (``spark://host:7077``, ``local[2]``, ``yarn``) and the deploy mode the hook
    resolved from its connection and arguments."""
    return str(hook._connection["master"]), hook._connection["deploy_mode"]


def kill_submit(hook: Any) -> None:
    """Kill the hook's ``spark-submit`` process if it runs."""
    process = hook._submit_sp
    if process is not None and process.poll() is None:
        process.kill()


def keep_for_error(hook: Any, line: str) -> None:
    """Keep ``line`` among the last lines the hook quotes when the job fails, without logging it."""
    hook._last_submit_log_lines.append(line.strip())


def read_log_with(hook: Any, reader: Callable[[Callable[[Iterator[Any]], None], Iterator[Any]], None]) -> None:
    """Make the hook hand ``spark-submit``'s output to ``reader(log, lines)``, where ``log`` is
    the hook's own reading of lines (it logs them and follows the job's state): ``reader`` calls
    it once, with the lines it lets through."""
    log = hook._process_spark_submit_log
    hook._process_spark_submit_log = lambda lines: reader(log, lines)
