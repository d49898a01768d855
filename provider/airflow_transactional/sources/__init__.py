"""Sources (spouts): the Postgres event log, the landing directory (on a disk, S3 or HDFS), and a Kafka topic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..connections import Connections
from ..exceptions import ConfigError
from ..model import Offsets
from .base import BatchPlan, Record, Source
from .eventlog import EventLog
from .kafka import KafkaSource
from .landing import LandingDirectory
from .objectlanding import ObjectLanding
from .pglog import PostgresLogSource

__all__ = ["BatchPlan", "EventLog", "KafkaSource", "LandingDirectory", "ObjectLanding", "Offsets", "PostgresLogSource",
           "Record", "Source", "source_from_config"]

def source_from_config(config: Mapping[str, Any], connections: Connections | None = None) -> Source:
    """Rebuild a source from the description stored with its topology; ``connections``: where the
    settings of its connections come from (default: the environment)."""
    cfg = dict(config)
    kind = cfg.pop("kind", None)
    cls = Source.kinds.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ConfigError(f"unknown source kind {kind!r}: use one of {', '.join(sorted(Source.kinds))}")
    source = cls.from_config(cfg)
    return source.with_connections(connections) if connections else source
