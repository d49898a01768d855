"""Declarations of a topology: its source, its state tables, its limits. Plain data, no I/O.

Everything is validated when the object is built, so a wrong declaration fails at DAG-parse
time with a message that names the fix, long before a database is touched.
"""

from .effects import MAX_OUTPUT_PARTITIONS, DecisionSpec, OutputSpec
from .states import DEFAULT_STATE_SCHEMA, StateSpec, version_name
from .topology import EVOLUTION_KEYS, MAX_BATCH_SIZE, MAX_IN_FLIGHT, SparkJob, TopologySpec

__all__ = ["DEFAULT_STATE_SCHEMA", "EVOLUTION_KEYS", "MAX_BATCH_SIZE", "MAX_IN_FLIGHT", "MAX_OUTPUT_PARTITIONS",
           "DecisionSpec", "OutputSpec", "SparkJob", "StateSpec", "TopologySpec", "version_name"]
