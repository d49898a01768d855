"""The topologies a DAG file declares, read the way the dag-processor reads it (the file is run,
nothing else): what ``airflow-txn register`` registers, and what the owner's ``audit`` and
``rebuild`` run a topology from."""

from __future__ import annotations

import os
import runpy
from dataclasses import replace
from typing import Any, NoReturn

from ..connections import redact
from ..exceptions import ConfigError, TransactionalError
from ..spec import EVOLUTION_KEYS, TopologySpec


def declared_topologies(dag_files: list[str]) -> list[TopologySpec]:
    """The topologies the DAG files declare, in file order."""
    specs = []
    for path in dag_files:
        if not os.path.isfile(path):
            raise ConfigError(f"no DAG file {path}")
        found = [task.topology for dag in _dags(_load(path)) for task in dag.tasks
                 if isinstance(getattr(task, "topology", None), dict) and task.task_id == "plan"]
        if not found:
            raise ConfigError(f"{path} declares no transactional topology (no transactional_dag in it)")
        specs += [TopologySpec.from_config(config) for config in found]
    return specs


def declared_as_stored(stored: TopologySpec, dag_file: str | None, command: str) -> TopologySpec:
    """The declaration of the ``stored`` topology in ``dag_file``, once it is the stored one.

    What an owner's command runs (the Spark job of ``audit`` and ``rebuild``) comes from the DAG
    file the owner names, never from the state store, which another role may reach; a stored
    declaration that differs is refused, naming the way to make them agree."""
    topology_id = stored.topology_id
    if not dag_file:
        raise ConfigError(f"{command} runs the topology's Spark job as you: name the DAG file that declares it "
                          f"(airflow-txn {command} {topology_id} --dag-file dags/{topology_id}.py); the job is taken "
                          "from that file, never from the state store")
    found = [spec for spec in declared_topologies([dag_file]) if spec.topology_id == topology_id]
    if not found:
        raise ConfigError(f"{dag_file} does not declare topology {topology_id!r}")
    mine, theirs = _compared(found[0]), _compared(stored)
    if mine != theirs:
        changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise ConfigError(f"the state store's declaration of {topology_id!r} differs from {dag_file}'s "
                          f"({', '.join(changed)}): refusing to {command} with either. Register the file as the "
                          f"schema's owner ('airflow-txn register {dag_file}'), or name the file that was registered")
    return found[0]


#: What a declaration may set from its environment without changing what an owner's command runs
#: or touches: how many batches are in flight, and how large (an example DAG reads them from the
#: environment, which the scheduler's and the owner's shell need not share), and when it counts as
#: stalled (derived from the schedule, which an example DAG reads from the environment too).
TUNING = ("max_in_flight", "max_batch_size", "stall_after_seconds")


def _compared(spec: TopologySpec) -> dict[str, Any]:
    """What must agree: the states the file declares whatever their stage (a state it adds is kept
    as declared, then building, then live; one it drops, retiring: ``core/evolution.py``), and
    everything but the tuning."""
    config = {k: v for k, v in spec.to_config().items() if k not in (*TUNING, *EVOLUTION_KEYS)}
    # A live state with a new version pending is declared at that version (under its own name).
    declared = [s for s in spec.states if s.name not in spec.retiring and spec.pending(s.name) is None]
    declared += [replace(s, name=s.replaces, replaces=None) if s.replaces else s
                 for s in (*spec.building, *spec.declared)]
    config["states"] = [s.to_config() for s in sorted(declared, key=lambda s: s.name)]
    return config


def _dags(names: dict[str, Any]) -> list[Any]:
    """The DAG objects among a DAG file's globals (not, say, the ``DAG`` class it imported, whose
    ``tasks`` is a property)."""
    return [value for value in names.values()
            if not isinstance(value, type) and isinstance(getattr(value, "tasks", None), (list, tuple))]


def _load(path: str) -> dict[str, Any]:
    """The globals of a DAG file, or a ConfigError saying in one line why it did not load."""
    real_exit = os._exit

    def refused_exit(code: int) -> NoReturn:  # a file that calls os._exit would end the owner's command silently
        raise ConfigError(f"{path} exited through os._exit (code {code}) while loading: a DAG file must only declare "
                          "its DAGs")

    os._exit = refused_exit  # type: ignore[assignment]
    try:
        return runpy.run_path(path)
    except KeyboardInterrupt:
        raise ConfigError(f"{path} was interrupted while loading (KeyboardInterrupt): a DAG file must only declare "
                          "its DAGs") from None
    except SyntaxError as exc:
        raise ConfigError(f"{path} does not parse: {exc.msg} (line {exc.lineno}): fix the file") from None
    except SystemExit as exc:
        raise ConfigError(f"{path} exited while loading (SystemExit {exc.code!r}): a DAG file must only declare "
                          "its DAGs") from None
    except TransactionalError:
        raise
    except Exception as exc:
        raise ConfigError(f"{path} failed to load: {type(exc).__name__}: {redact(str(exc)).strip()[:500]}") from None
    finally:
        os._exit = real_exit
