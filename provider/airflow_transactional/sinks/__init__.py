"""Sinks: where committed output goes beyond the state store -- a Kafka topic."""
