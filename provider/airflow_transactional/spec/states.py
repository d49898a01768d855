"""A state a topology keeps: its table, keys, value and combiner. Plain data, validated when built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import identifiers
from ..exceptions import ConfigError
from ..values import Combiner, ValueKind

DEFAULT_STATE_SCHEMA = "public"


def version_name(name: str, version: int) -> str:
    """The name version ``version`` of state ``name`` is kept under beside the live one (pending or archived)."""
    return f"{name}__v{version}"


@dataclass(frozen=True)
class StateSpec:
    """A keyed state table updated by the commit phase.

    ``keys`` maps key column names to SQL types (``{"url": "text"}``); the provider adds
    ``value`` (of ``value_type``), ``txid`` and, for opaque values, ``prev_value``. The table is
    ``table`` (default: the state's name) in ``schema`` (default ``public``; ``table`` may also
    say ``"schema.table"``) -- apart from the provider's own bookkeeping in ``airflow_txn``.
    ``database`` names another Postgres (see ``Coordinator(external_dsns=...)``): such a state
    is not atomic with the checkpoint and relies on the per-value txid rule to stay idempotent.

    ``version`` redefines a live state (``core/evolution.py``): a declaration with a higher version
    than the live one -- its transform, keys, combiner or value type changed -- is built beside it
    and switched in at one txid. The provider keeps such a pending version under the name
    ``<name>__v<version>`` with ``replaces`` naming the live state; its table defaults to that
    state's.
    """

    name: str
    keys: Mapping[str, str]
    combiner: Combiner | str = Combiner.SUM
    value_type: str = "bigint"
    kind: ValueKind | str = ValueKind.TRANSACTIONAL
    table: str | None = None
    database: str | None = None
    schema: str | None = None
    version: int = 1
    replaces: str | None = None

    def __post_init__(self) -> None:
        identifiers.name("state name", self.name)
        if type(self.version) is not int or self.version < 1:
            raise ConfigError(f"state {self.name!r}: version must be a whole number from 1, got {self.version!r} "
                              "(raise it by one to redefine a live state)")
        if self.replaces is not None:
            identifiers.name("state name", self.replaces)
        if not isinstance(self.keys, Mapping):
            raise ConfigError(f"state {self.name!r}: keys must map each key column to its SQL type, e.g. "
                              f"keys={{'url': 'text'}}, not {type(self.keys).__name__} {self.keys!r}")
        if not self.keys:
            raise ConfigError(
                f"state {self.name!r} has no key columns: give keys={{'column': 'text'}} "
                "(a single global value uses a constant key, e.g. {'id': 'text'} with key 'all')"
            )
        keys = {identifiers.column(c): identifiers.sql_type(t) for c, t in dict(self.keys).items()}
        object.__setattr__(self, "keys", keys)
        combiner = Combiner.parse(self.combiner)
        object.__setattr__(self, "combiner", combiner)
        value_type = identifiers.sql_type(self.value_type)
        if combiner.numeric and value_type not in ("bigint", "integer", "numeric", "double precision"):
            raise ConfigError(
                f"state {self.name!r}: combiner {combiner.value!r} needs a numeric value_type "
                f"(bigint, integer, numeric, double precision), not {value_type!r}"
            )
        object.__setattr__(self, "value_type", value_type)
        object.__setattr__(self, "kind", ValueKind.parse(self.kind))
        if self.schema is not None:
            identifiers.name("schema name", self.schema)
            if "." in (self.table or ""):
                raise ConfigError(f"state {self.name!r}: give the schema once, as schema={self.schema!r} or in "
                                  f"table='schema.table', not both")
        self.schema_and_table  # noqa: B018 -- validates the table name now, at parse time
        if self.database is not None:
            identifiers.name("database name", self.database)

    @property
    def schema_and_table(self) -> tuple[str, str]:
        return identifiers.qualified_table(self.table or self.replaces or self.name,
                                           self.schema or DEFAULT_STATE_SCHEMA)

    @property
    def key_columns(self) -> list[str]:
        return list(self.keys)

    def to_config(self) -> dict[str, Any]:
        keys = list(self.keys)
        return {
            "name": self.name,
            "keys": dict(self.keys),
            # The state store keeps a declaration as jsonb, whose objects keep their keys in an order of
            # their own: a record function's key tuples follow the declared order, so it is kept apart.
            **({"key_order": keys} if keys != sorted(keys, key=_jsonb_order) else {}),
            "combiner": Combiner.parse(self.combiner).value,
            "value_type": self.value_type,
            "kind": ValueKind.parse(self.kind).value,
            "table": self.table,
            "database": self.database,
            **({"schema": self.schema} if self.schema else {}),  # absent from older declarations
            **({"version": self.version} if self.version != 1 else {}),
            **({"replaces": self.replaces} if self.replaces else {}),
        }

    @property
    def shown(self) -> str:
        """How a person is told of this state: a pending version as ``<name> version <N>``."""
        return f"{self.replaces} version {self.version}" if self.replaces else self.name

    @property
    def job_key(self) -> str:
        """What a job calls this version of the state while another replaces it: ``name@version``."""
        return f"{self.replaces or self.name}@{self.version}"

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> StateSpec:
        given = dict(config)
        order = given.pop("key_order", None)
        if order is not None:
            given["keys"] = {k: given["keys"][k] for k in order}
        return cls(**given)


def _jsonb_order(key: str) -> tuple[int, bytes]:
    """Where jsonb puts an object's key: shorter keys first, then by their bytes."""
    raw = key.encode()
    return len(raw), raw
