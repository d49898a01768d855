"""Where connections' settings come from: an object handed to whoever resolves one, never a
process-wide setting -- two coordinators (or a driver and a task) in one process resolve the same
connection id each its own way."""

from __future__ import annotations

import json

import pytest

from airflow_transactional.connections import Connections
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.sources import KafkaSource, source_from_config
from airflow_transactional.sources.base import connections_for
from airflow_transactional.sources.kafka import client_config
from airflow_transactional.spec import StateSpec, TopologySpec

pytestmark = pytest.mark.unit

SHIPPED = {"bootstrap.servers": "shipped:9092", "sasl.password": "s3cret-shipped"}


def test_known_settings_come_first_then_the_resolver_and_each_object_keeps_its_own(monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_EVENTS", json.dumps({"conn_type": "kafka",
                                                          "extra": {"bootstrap.servers": "env:9092"}}))
    asked: list[str] = []

    def airflow(conn_id: str) -> dict:
        asked.append(conn_id)
        return {"bootstrap.servers": f"airflow-{conn_id}:9092"}

    shipped, task, plain = Connections(known={"events": SHIPPED}), Connections(airflow), Connections()
    assert shipped.settings("events") == SHIPPED
    assert task.settings("events") == {"bootstrap.servers": "airflow-events:9092"} and asked == ["events"]
    assert plain.settings("events") == {"bootstrap.servers": "env:9092"}
    assert shipped.settings("events") == SHIPPED  # the others did not change it
    shipped.settings("events")["bootstrap.servers"] = "changed"
    assert shipped.settings("events") == SHIPPED  # a copy each time
    assert "s3cret" not in repr(shipped) and "events" in repr(shipped)


def test_a_source_resolves_with_the_connections_it_was_rebuilt_with() -> None:
    config = KafkaSource("clicks", kafka_conn_id="events").to_config()
    bound = source_from_config(config, Connections(known={"events": SHIPPED}))
    assert connections_for(bound) == {"events": SHIPPED}
    assert client_config("events", bound.connections)["bootstrap.servers"] == "shipped:9092"
    assert bound == source_from_config(config) and "connections" not in bound.to_config()  # not declared
    spec = TopologySpec(topology_id="t", source=KafkaSource("clicks", kafka_conn_id="events"),
                        states=[StateSpec("s", {"k": "text"})])
    rebuilt = TopologySpec.from_config(spec.to_config(), Connections(known={"events": SHIPPED}))
    assert connections_for(rebuilt.source) == {"events": SHIPPED}


def test_an_unknown_connection_names_the_fix(monkeypatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_NOWHERE", raising=False)
    with pytest.raises(ConfigError, match="AIRFLOW_CONN_NOWHERE"):
        Connections(known={"events": SHIPPED}).settings("nowhere")
