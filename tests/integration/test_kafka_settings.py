"""A Kafka connection's settings against whoever may edit the connection: only the allow-list
reaches librdkafka (and Spark's reader through it), so no setting loads a library, runs a
command or breaks out of the JAAS line -- tried with a real shared library and real clients."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from airflow_transactional import KafkaSource
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.sources.kafka import client_config
from airflow_transactional.spark.kafka import kafka_options

pytestmark = pytest.mark.integration

#: A shared library whose constructor leaves a mark: what ``plugin.library.paths`` would load.
PLUGIN = """
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void loaded(void) {
    int fd = open("%(mark)s", O_WRONLY | O_CREAT, 0600);
    if (fd >= 0) close(fd);
}
"""


def _connection(monkeypatch: pytest.MonkeyPatch, **extra: object) -> str:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EDITED", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:9", **extra}}))
    return "kafka_edited"


def test_a_plugin_library_in_the_connection_is_refused_before_any_client_loads_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Regression: ``{"plugin.library.paths": "<a .so>"}`` ran the library's constructor in the
    process that planned, showed status (the api-server) or published (the owner's shell)."""
    mark = tmp_path / "constructor-ran"
    source = tmp_path / "plugin.c"
    source.write_text(PLUGIN % {"mark": mark})
    library = tmp_path / "plugin.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    conn_id = _connection(monkeypatch, **{"plugin.library.paths": str(library)})
    with pytest.raises(ConfigError, match=r"'plugin\.library\.paths' loads a shared library into the process"):
        KafkaSource("events", kafka_conn_id=conn_id).snapshot()
    assert not mark.exists(), "librdkafka loaded the connection's library"


@pytest.mark.parametrize(("extra", "refusal"), [
    ({"sasl.kerberos.kinit.cmd": "touch /tmp/x"}, "runs a shell command"),
    ({"ssl.engine.location": "/tmp/engine.so"}, "loads an OpenSSL engine"),
    ({"ssl.providers": "legacy"}, "loads OpenSSL provider modules"),
    ({"oauthbearer_token_refresh_cb": "x"}, "is a callback"),
    ({"interceptor.classes": "com.x.Evil"}, "is not one the provider passes to Kafka clients"),
    ({"sasl.username": "u\"\nx", "sasl.password": "p"}, "'sasl.username' holds a control character"),
    ({"sasl.password": "p\n"}, "'sasl.password' holds a control character"),
    ({"bootstrap.servers": "b:9092\nx"}, "'bootstrap.servers' holds a control character"),
    ({"linger.ms": [1]}, "is not a librdkafka setting"),
    ({"socket.timeout.ms": "soon"}, r"'socket\.timeout\.ms' must be a whole number .*got 'soon'"),
    ({"linger.ms": 2.5}, r"'linger\.ms' must be a whole number"),
    ({"retries": "99999999999"}, r"'retries' must be a whole number"),
    ({"check.crcs": "yes"}, r"'check\.crcs' must be true or false"),
])
def test_settings_that_run_code_break_out_or_misread_are_refused_by_name(
        monkeypatch: pytest.MonkeyPatch, extra: dict[str, object], refusal: str) -> None:
    conn_id = _connection(monkeypatch, **extra)
    with pytest.raises(ConfigError, match=refusal) as refused:
        client_config(conn_id)
    assert "touch /tmp/x" not in str(refused.value) and "\n" not in str(refused.value)


def test_the_allowed_settings_reach_the_clients_and_sparks_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    conn_id = _connection(monkeypatch, **{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                          "sasl.username": "u", "sasl.password": "p", "linger.ms": 5,
                                          "group.id": "theirs"})
    settings = client_config(conn_id)
    assert settings == {"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SASL_SSL",
                        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u", "sasl.password": "p",
                        "linger.ms": 5}
    options = kafka_options(settings)
    assert options["kafka.sasl.jaas.config"].endswith('username="u" password="p";')


@pytest.mark.parametrize("topic", ["événements", "tweets\u00b2", "a b"])
def test_a_topic_name_kafka_would_refuse_is_refused_at_declaration(topic: str) -> None:
    with pytest.raises(ConfigError, match="1 to 249 ASCII letters"):
        KafkaSource(topic)
