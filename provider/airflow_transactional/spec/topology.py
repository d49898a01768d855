"""A topology: its source, states, outputs, decisions, Spark job and limits. Plain data, validated
when built."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import identifiers, quarantine
from ..connections import Connections
from ..exceptions import ConfigError
from ..limits import value_range
from ..sources import PostgresLogSource, Source, source_from_config
from ..values import Combiner, ValueKind
from .effects import DecisionSpec, OutputSpec
from .states import StateSpec

# Upper bounds that catch a typo before it costs anything: each transaction in flight holds an
# Airflow run slot, and one batch is read, parsed and staged as a whole.
MAX_IN_FLIGHT = 100_000
MAX_BATCH_SIZE = 100_000_000


@dataclass(frozen=True)
class SparkJob:
    """The Spark application that processes a topology's batches, and audits and rebuilds it:
    ``application`` (a path), the ``application_args`` passed on to it, and the ``py_files`` it
    imports (comma-separated, as ``spark-submit`` takes them)."""

    application: str
    application_args: Sequence[str] = ()
    py_files: str | None = None

    def __post_init__(self) -> None:
        args = self.application_args
        for name, want, ok in (
                ("application", "a path", isinstance(self.application, str) and self.application),
                ("application_args", "a list of strings", not isinstance(args, (str, bytes)) and all(
                    isinstance(a, str) for a in args)),
                ("py_files", "comma-separated paths", isinstance(self.py_files, (str, type(None))))):
            if not ok:
                raise ConfigError(f"{name} must be {want}, got {getattr(self, name)!r}")
        object.__setattr__(self, "application_args", tuple(args))

    def to_config(self) -> dict[str, Any]:
        return {"application": self.application, "application_args": list(self.application_args),
                **({"py_files": self.py_files} if self.py_files else {})}


#: What a stored declaration says of its states' evolution, beyond what a DAG file declares.
EVOLUTION_KEYS = ("building", "declared", "retiring", "built", "retired")


@dataclass(frozen=True)
class TopologySpec:
    """A transactional topology: one source, one or more states, and its limits.

    ``max_in_flight`` is Storm's ``topology.max.spout.pending``: how many planned, uncommitted
    transactions may exist at once. ``max_batch_size`` caps one batch (events, or files for a landing
    directory). ``opaque`` lets a batch that can no longer be read be re-planned from the committed
    checkpoint (with every later uncommitted txid). ``on_bad_record``: ``"quarantine"`` or ``"fail"``.
    ``outputs`` are the event logs its commit appends to (:class:`OutputSpec`), ``decisions`` the rules
    it applies request by request (:class:`DecisionSpec`), ``job`` its Spark application
    (:class:`SparkJob`), ``dag_id`` the one DAG that runs it (default: its id), ``stall_after_seconds``
    how long it may go without a commit while its source holds records before it is stalled (None: never),
    ``max_quarantined`` the share of a txid's records it may set aside and commit (:mod:`..quarantine`).

    A running topology's states evolve (``core/evolution.py``): a state its DAG file adds is
    ``declared`` (its transform's rows are dropped) until the owner approves it; then it is
    ``building`` -- every attempt folds and stages it, no commit applies it -- until it is switched
    in, when it joins ``states`` and ``built`` records the txid its values were first computed at
    (its delta history, and its verification, start there). A live state the file no longer
    declares is ``retiring`` (still kept) until approved, then ``retired``: ``{name: {"txid": N,
    "state": its declaration}}``, its table kept as it was at txid N."""

    topology_id: str
    source: Source
    states: Sequence[StateSpec]
    max_in_flight: int = 3
    max_batch_size: int = 100_000
    opaque: bool = False
    on_bad_record: str = "quarantine"
    outputs: Sequence[OutputSpec] = ()
    decisions: Sequence[DecisionSpec] = ()
    job: SparkJob | None = None
    dag_id: str | None = None
    stall_after_seconds: int | None = None
    max_quarantined: float | None = quarantine.DEFAULT_SHARE
    building: Sequence[StateSpec] = ()
    declared: Sequence[StateSpec] = ()
    built: Mapping[str, int] = field(default_factory=dict)
    retiring: Sequence[str] = ()
    retired: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def dag(self) -> str:
        """The DAG that runs the topology: ``dag_id``, else the one named after it."""
        return self.dag_id or self.topology_id

    def __post_init__(self) -> None:
        identifiers.topology_id(self.topology_id)
        states = _sequence(self.topology_id, "states", self.states, "[StateSpec('counts', {'key': 'text'})]")
        if not states:
            raise ConfigError(f"topology {self.topology_id!r} has no states: give at least one StateSpec")
        names = [s.name for s in states]
        if len(set(names)) != len(names):
            raise ConfigError(f"topology {self.topology_id!r}: state names must be unique, got {names}")
        for attr in ("building", "declared"):
            object.__setattr__(self, attr, _sequence(self.topology_id, attr, getattr(self, attr), "[]"))
        names += [s.name for s in (*self.building, *self.declared)]
        if len(set(names)) != len(names):
            raise ConfigError(f"topology {self.topology_id!r}: a state is declared twice (live, building or "
                              f"declared): {names}")
        object.__setattr__(self, "built", dict(self.built))
        object.__setattr__(self, "retiring", tuple(self.retiring))
        object.__setattr__(self, "retired", dict(self.retired))
        tables = [s.schema_and_table for s in states]
        if len(set(tables)) != len(tables):
            raise ConfigError(f"topology {self.topology_id!r}: two states write the same table")
        object.__setattr__(self, "states", states)
        for attr, most in (("max_in_flight", MAX_IN_FLIGHT), ("max_batch_size", MAX_BATCH_SIZE)):
            val = getattr(self, attr)
            if not isinstance(val, int) or isinstance(val, bool) or not 1 <= val <= most:
                raise ConfigError(f"topology {self.topology_id!r}: {attr} must be an integer from 1 to {most:,}, "
                                  f"got {val!r}")
        if not isinstance(self.opaque, bool):
            raise ConfigError(f"topology {self.topology_id!r}: opaque must be True or False, got {self.opaque!r}")
        for name, want, ok in (
                ("job", "a SparkJob", isinstance(self.job, (SparkJob, type(None)))),
                ("dag_id", "a DAG id", self.dag_id is None or (isinstance(self.dag_id, str) and self.dag_id)),
                ("stall_after_seconds", "a positive number of seconds", self.stall_after_seconds is None or (
                    type(self.stall_after_seconds) is int and self.stall_after_seconds > 0)),
                ("on_bad_record", "'quarantine' or 'fail'", self.on_bad_record in ("quarantine", "fail"))):
            if not ok:
                raise ConfigError(f"topology {self.topology_id!r}: {name} must be {want}, got {getattr(self, name)!r}")
        object.__setattr__(self, "max_quarantined", quarantine.checked_share(self.topology_id, self.max_quarantined))
        self._check_outputs()
        self._check_decisions()

    def _declared(self, kind: str, cls: type, example: str, others: str, taken: set[str]) -> tuple[Any, ...]:
        """Check the topology's ``kind`` s (outputs, decisions): ``cls`` instances, with names unique
        and none in ``taken`` (the names of ``others``); stored as a tuple, and returned."""
        declared = _sequence(self.topology_id, f"{kind}s", getattr(self, f"{kind}s"), f"[{example}]")
        if any(not isinstance(d, cls) for d in declared):
            raise ConfigError(f"topology {self.topology_id!r}: {kind}s must be {example} declarations, "
                              f"got {declared!r}")
        object.__setattr__(self, f"{kind}s", declared)
        names = [d.name for d in declared]
        if len(set(names)) != len(names) or taken & set(names):
            raise ConfigError(f"topology {self.topology_id!r}: {kind} names must be unique and differ from "
                              f"the {others} names, got {kind}s {names}")
        return declared

    def _check_decisions(self) -> None:
        decisions = self._declared("decision", DecisionSpec, "DecisionSpec('name', state=...)", "state and output",
                                   {s.name for s in self.states} | {o.name for o in self.outputs})
        owners = [d.state for d in decisions]
        if len(set(owners)) != len(owners):
            raise ConfigError(f"topology {self.topology_id!r}: two decisions update the same state ({owners})")
        for d in decisions:
            state = self.state(d.state)
            if (Combiner.parse(state.combiner) is not Combiner.SUM or ValueKind.parse(state.kind)
                    is not ValueKind.TRANSACTIONAL or state.database is not None):
                raise ConfigError(f"decision {d.name!r}: its state {d.state!r} must be a transactional sum state "
                                  "in the state store (combiner='sum', kind='transactional', no database): the "
                                  "commit reads and updates the balance in its own transaction")
            low, high = value_range(state.value_type)
            if not low <= d.floor <= high:
                raise ConfigError(f"decision {d.name!r}: floor {d.floor!r} is outside what its state {d.state!r} "
                                  f"({state.value_type}) can hold ({low:g} to {high:g}): give a floor in that range")

    @property
    def decided_states(self) -> frozenset[str]:
        """The states only a decision updates (the transform returns no rows for them)."""
        return frozenset(d.state for d in self.decisions)

    @property
    def recomputable_states(self) -> tuple[StateSpec, ...]:
        """The states an audit can recompute from the source in parallel: not those a decision
        keeps (their verdicts depended on the order of the commits)."""
        return tuple(s for s in self.states if s.name not in self.decided_states)

    @property
    def folded_states(self) -> tuple[StateSpec, ...]:
        """The states every processing attempt folds and stages: the recomputable ones and those
        being built (``building``)."""
        return (*self.recomputable_states, *self.building)

    @property
    def retired_states(self) -> dict[str, StateSpec]:
        """Each retired state's declaration, by name (its table kept as it was when retired)."""
        return {name: StateSpec.from_config(r["state"]) for name, r in self.retired.items()}

    @property
    def unkept(self) -> frozenset[str]:
        """The states whose rows a job may return and nothing keeps: declared (not approved yet) and
        retired ones."""
        return frozenset({*(s.name for s in self.declared), *self.retired})

    def archived_at(self, name: str, txid: int) -> Mapping[str, Any] | None:
        """What ``retired`` keeps of the archived version of state ``name`` that was live at
        ``txid`` (None: the live version was): ``core/redefinition.py``."""
        return next((r for r in self.retired.values()
                     if r.get("of") == name and int(r["from"]) <= txid <= int(r["txid"])), None)

    def version_at(self, name: str, txid: int | None) -> StateSpec:
        """The declaration of state ``name`` in force at ``txid`` (None: now)."""
        kept = None if txid is None else self.archived_at(name, txid)
        return self.state(name) if kept is None else StateSpec.from_config(kept["state"])

    def pending(self, name: str) -> StateSpec | None:
        """The new version of live state ``name`` declared or being built beside it (None: none)."""
        return next((s for s in (*self.building, *self.declared) if s.replaces == name), None)

    def redefined_hint(self, missing: Sequence[str]) -> str:
        """What a job that returned no rows for live states ``missing`` must return while they are redefined."""
        keys = [f"{self.state(n).job_key!r}" for n in missing if self.pending(n) is not None]
        if not keys:
            return ""
        return (f": while a state is redefined the job returns the live version's rows (its transform as it was) "
                f"as {', '.join(keys)} and the new version's under the state's name, until the switch")

    @property
    def job_routes(self) -> dict[str, str | None]:
        """The job's row keys that do not name the state they feed (None: nothing keeps them). While
        a state is redefined its name feeds the new version (once approved: before, nothing) and
        ``name@N`` the live version N; an archived version's ``name@N``, a declared state's and a
        retired one's rows are kept by nothing."""
        routes: dict[str, str | None] = dict.fromkeys(self.unkept)
        for record in self.retired.values():
            if record.get("of"):  # an archived version of a redefined state
                routes[f"{record['of']}@{int(record['state'].get('version', 1))}"] = None
        for new in (*self.building, *self.declared):
            if new.replaces:
                routes[new.replaces] = new.name if new in self.building else None
                routes[self.state(new.replaces).job_key] = new.replaces
        return routes

    def decision(self, name: str) -> DecisionSpec:
        return _named(self.topology_id, "decision", self.decisions, name)

    def _check_outputs(self) -> None:
        outputs = self._declared("output", OutputSpec, "OutputSpec('name', ...)", "state",
                                 {s.name for s in self.states})
        logs = [o.log_name for o in outputs]
        if len(set(logs)) != len(logs):
            raise ConfigError(f"topology {self.topology_id!r}: two outputs append to the same log ({logs})")
        source = self.source
        if isinstance(source, PostgresLogSource) and source.schema is None and source.log in logs:
            raise ConfigError(f"topology {self.topology_id!r} reads log {source.log!r} and appends to it: "
                              "a topology's output must be another log (a cycle would feed each commit "
                              "into the next batch for ever)")

    def output(self, name: str) -> OutputSpec:
        return _named(self.topology_id, "output", self.outputs, name)

    def state(self, name: str) -> StateSpec:
        """The live or building state called ``name`` (building: attempts stage it)."""
        return _named(self.topology_id, "state", (*self.states, *self.building), name)

    def to_config(self) -> dict[str, Any]:
        return {
            "topology_id": self.topology_id,
            "source": self.source.to_config(),
            "states": [s.to_config() for s in self.states],
            "max_in_flight": self.max_in_flight,
            "max_batch_size": self.max_batch_size,
            "opaque": self.opaque,
            "on_bad_record": self.on_bad_record,
            **({"outputs": [o.to_config() for o in self.outputs]} if self.outputs else {}),
            **({"decisions": [d.to_config() for d in self.decisions]} if self.decisions else {}),
            **({"job": self.job.to_config()} if self.job else {}),
            **({"dag_id": self.dag_id} if self.dag_id else {}),
            **({"stall_after_seconds": self.stall_after_seconds} if self.stall_after_seconds else {}),
            **({"max_quarantined": self.max_quarantined} if self.max_quarantined != quarantine.DEFAULT_SHARE else {}),
            **({"building": [s.to_config() for s in self.building]} if self.building else {}),
            **({"declared": [s.to_config() for s in self.declared]} if self.declared else {}),
            **({"built": dict(self.built)} if self.built else {}),
            **({"retiring": list(self.retiring)} if self.retiring else {}),
            **({"retired": dict(self.retired)} if self.retired else {}),
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any], connections: Connections | None = None) -> TopologySpec:
        """The declaration stored as ``config``; its source resolves connections with ``connections``."""
        return cls(
            topology_id=config["topology_id"],
            source=source_from_config(config["source"], connections),
            states=[StateSpec.from_config(s) for s in config["states"]],
            max_in_flight=config["max_in_flight"],
            max_batch_size=config["max_batch_size"],
            opaque=config["opaque"],
            on_bad_record=config["on_bad_record"],
            outputs=[OutputSpec.from_config(o) for o in config.get("outputs", ())],
            decisions=[DecisionSpec.from_config(d) for d in config.get("decisions", ())],
            job=SparkJob(**config["job"]) if config.get("job") else None,
            dag_id=config.get("dag_id"),
            stall_after_seconds=config.get("stall_after_seconds"),
            max_quarantined=config.get("max_quarantined", quarantine.DEFAULT_SHARE),
            building=[StateSpec.from_config(s) for s in config.get("building", ())],
            declared=[StateSpec.from_config(s) for s in config.get("declared", ())],
            built={str(k): int(v) for k, v in dict(config.get("built") or {}).items()},
            retiring=list(config.get("retiring", ())),
            retired=dict(config.get("retired") or {}),
        )


def _sequence(topology_id: str, what: str, given: Any, example: str) -> tuple[Any, ...]:
    """``given`` as a tuple when it is a list or tuple of declarations (one alone is refused, naming the fix)."""
    if isinstance(given, (str, bytes, Mapping)) or not isinstance(given, Sequence):
        raise ConfigError(f"topology {topology_id!r}: {what} must be a list, e.g. {what}={example}; got {given!r}")
    return tuple(given)


def _named(topology_id: str, kind: str, declared: Sequence[Any], name: str) -> Any:
    """The one of ``declared`` (states, outputs or decisions) called ``name``, or a ConfigError naming them."""
    found = next((d for d in declared if d.name == name), None)
    if found is not None:
        return found
    raise ConfigError(f"topology {topology_id!r} has no {kind} {name!r} "
                      f"({kind}s: {', '.join(d.name for d in declared) or 'none'})")
