"""Which of a ``kafka`` connection's settings reach a Kafka client: one allow-list, for every
librdkafka client the provider makes (the plan, status and lag in the views and the stall watch,
the publisher, the owner's CLI) and, through them, Spark's Kafka reader (:mod:`..spark.kafka`).

Whoever may edit an Airflow connection must not run code where the provider runs: librdkafka loads
a shared library named by ``plugin.library.paths`` (its constructor ran as root in the api-server),
runs the command of ``sasl.kerberos.kinit.cmd``, loads an OpenSSL engine or provider module. A
setting off the list is refused by name -- never its value -- with the list's place; so is a value
holding a control character (a newline would break out of the JAAS line Spark's reader is given).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..exceptions import ConfigError

#: Settings that only a consumer group uses: the provider reads by offset, never through a group,
#: so they are taken and left out.
GROUP_KEYS = frozenset({"group.id", "enable.auto.commit", "auto.offset.reset", "group.instance.id"})

#: Settings a connection may carry: where the brokers are and how to log in, and the tuning of a
#: consumer's fetches and a producer's batches. Nothing that names a file to load as code, a
#: command, or a callback.
ALLOWED = frozenset({
    # reaching the cluster
    "bootstrap.servers", "client.id", "client.rack", "broker.address.family", "security.protocol",
    "socket.timeout.ms", "socket.connection.setup.timeout.ms", "socket.keepalive.enable", "socket.nagle.disable",
    "socket.receive.buffer.bytes", "socket.send.buffer.bytes", "connections.max.idle.ms", "reconnect.backoff.ms",
    "reconnect.backoff.max.ms", "retry.backoff.ms", "retry.backoff.max.ms", "request.timeout.ms",
    "metadata.max.age.ms", "topic.metadata.refresh.interval.ms", "api.version.request",
    "api.version.request.timeout.ms", "log_level",
    # TLS: certificates and keys by path or PEM text
    "ssl.ca.location", "ssl.ca.pem", "ssl.crl.location", "ssl.certificate.location", "ssl.certificate.pem",
    "ssl.key.location", "ssl.key.pem", "ssl.key.password", "ssl.keystore.location", "ssl.keystore.password",
    "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification", "ssl.cipher.suites",
    "ssl.curves.list", "ssl.sigalgs.list",
    # SASL
    "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password", "sasl.kerberos.service.name",
    "sasl.kerberos.principal", "sasl.kerberos.keytab", "sasl.kerberos.min.time.before.relogin",
    "sasl.oauthbearer.method", "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.scope", "sasl.oauthbearer.extensions", "sasl.oauthbearer.token.endpoint.url",
    # a consumer's fetches
    "fetch.min.bytes", "fetch.max.bytes", "max.partition.fetch.bytes", "fetch.wait.max.ms",
    "fetch.error.backoff.ms", "queued.min.messages", "queued.max.messages.kbytes", "check.crcs",
    # a producer's batches
    "linger.ms", "queue.buffering.max.ms", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
    "batch.num.messages", "batch.size", "compression.type", "compression.codec", "compression.level",
    "message.max.bytes", "message.timeout.ms", "delivery.timeout.ms", "transaction.timeout.ms",
    "message.send.max.retries", "retries",
    *GROUP_KEYS,
})

#: Settings librdkafka reads as true or false.
BOOLEANS = frozenset({"socket.keepalive.enable", "socket.nagle.disable", "api.version.request",
                      "enable.ssl.certificate.verification", "check.crcs", "enable.auto.commit"})
#: Settings librdkafka reads as a whole number (besides every ``*.ms``, ``*.bytes`` and ``*.kbytes``).
_WHOLE = frozenset({"queued.min.messages", "queue.buffering.max.messages", "batch.num.messages", "batch.size",
                    "compression.level", "message.send.max.retries", "retries",
                    "sasl.kerberos.min.time.before.relogin"})
#: The largest whole number librdkafka takes (its settings are C ints).
_INT_MAX = 2**31 - 1


def _value_refusal(name: str, value: Any) -> str | None:
    """Why ``value`` is not what librdkafka reads ``name`` as (None: it is): refused here, by name,
    instead of by the client's own ``KafkaException`` far from the connection that holds it."""
    text = str(value).strip().lower()
    if name in BOOLEANS:
        ok = isinstance(value, bool) or text in ("true", "false")
        return None if ok else "must be true or false"
    if name in _WHOLE or name.endswith((".ms", ".bytes", ".kbytes")):
        ok = (not isinstance(value, (bool, float)) and re.fullmatch(r"-?[0-9]{1,10}", text) is not None
              and abs(int(text)) <= _INT_MAX)
        return None if ok else f"must be a whole number (at most {_INT_MAX:,})"
    return None


#: Settings that run code or a command, refused with the reason (librdkafka's names).
_RUNS_CODE = {
    "plugin.library.paths": "loads a shared library into the process",
    "sasl.kerberos.kinit.cmd": "runs a shell command",
    "ssl.engine.location": "loads an OpenSSL engine (a shared library)",
    "ssl.engine.id": "selects a loaded OpenSSL engine",
    "ssl.providers": "loads OpenSSL provider modules",
    "ssl_engine_callback_data": "is handed to an OpenSSL engine",
}


def checked_settings(conn_id: str, extra: Mapping[Any, Any]) -> dict[str, Any]:
    """``extra`` (a connection's settings) as a Kafka client may take them: on :data:`ALLOWED`, plain
    values without control characters, the group's settings left out; else a ConfigError naming the
    setting (never its value) and the fix."""
    where = f"Kafka connection {conn_id!r}"
    for key, value in extra.items():
        name = str(key)
        if not isinstance(key, str) or callable(value) or not isinstance(value, (str, int, float, bool)):
            raise ConfigError(f"{where}: setting {name[:80]!r} is not a librdkafka setting (text key, plain value)")
        why = _RUNS_CODE.get(name) or ("runs a command" if name.endswith(".cmd") else None) or (
            "is a callback" if name.endswith("_cb") else None)
        if why is not None:
            raise ConfigError(f"{where}: setting {name!r} {why}: the provider never passes it (whoever may edit "
                              "the connection would run code in the api-server and the workers); remove it")
        if name not in ALLOWED:
            raise ConfigError(f"{where}: setting {name[:80]!r} is not one the provider passes to Kafka clients: "
                              "remove it, or see airflow_transactional.sources.kafka_settings.ALLOWED for those it "
                              "does (where the brokers are, TLS, SASL, fetch and batch tuning)")
        if isinstance(value, str) and any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ConfigError(f"{where}: setting {name!r} holds a control character (a newline?): remove it")
        why = _value_refusal(name, value)
        if why is not None:
            raise ConfigError(f"{where}: setting {name!r} {why}, got {str(value)[:40]!r}: fix it in the connection")
    return {k: v for k, v in extra.items() if k not in GROUP_KEYS}
