"""The Airflow hook of the state store: turns a Connection into a DSN and a Coordinator.

Only the connection fields libpq needs are used, and only allowlisted extras are forwarded
(never the extras wholesale). A ``postgres`` connection works too; the ``transactional`` type
adds the provider's own form (state schema) to the Airflow UI.
"""

from __future__ import annotations

import copy
from typing import Any

from airflow.sdk import BaseHook
from psycopg2.extensions import make_dsn

from .. import CONNECTION_TYPE, HOOK_NAME, UI_FIELD_BEHAVIOUR
from ..connections import Connections, settings_of
from ..coordinator import Coordinator
from ..exceptions import ConfigError
from ..model import DEFAULT_SCHEMA

# libpq keywords an Airflow connection's extras may set; everything else is ignored.
ALLOWED_EXTRAS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout",
                  "target_session_attrs", "options")


def dsn_from_fields(*, host: str | None, port: int | None, login: str | None, password: str | None,
                    database: str | None, extras: dict[str, Any]) -> str:
    """A libpq DSN from connection fields and allowlisted extras."""
    params: dict[str, Any] = {"host": host or "localhost", "port": port or 5432,
                              "dbname": database or "postgres"}
    if login:
        params["user"] = login
    if password:
        params["password"] = password
    params.update({k: extras[k] for k in ALLOWED_EXTRAS if extras.get(k) not in (None, "")})
    return make_dsn(**params)


def connection_settings(conn_id: str) -> dict[str, Any]:
    """What a source reads of Airflow connection ``conn_id`` (:func:`..connections.settings_of`: a
    ``kafka`` connection's librdkafka settings, an ``aws`` or ``webhdfs`` one's), from wherever
    Airflow keeps connections."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:  # AirflowNotFoundException, a secrets backend's own errors
        raise ConfigError(f"no Airflow connection {conn_id!r} ({type(exc).__name__}): add it -- for a Kafka source "
                          'one of type kafka whose extra holds the librdkafka settings, e.g. {"bootstrap.servers": '
                          '"broker:9092"}; for S3 one of type aws; for HDFS one of type webhdfs') from None
    extra = conn.extra_dejson
    if not isinstance(extra, dict):
        raise ConfigError(f"the extra of Airflow connection {conn_id!r} must be an object")
    return settings_of(conn.conn_type, host=conn.host, port=conn.port, login=conn.login, password=conn.password,
                       extra=extra)


#: Connections resolved from wherever Airflow keeps them (its database, a secrets backend).
AIRFLOW_CONNECTIONS = Connections(connection_settings)


class TransactionalHook(BaseHook):
    """Connects to the PostgreSQL that holds a topology's transaction state.

    :param transactional_conn_id: an Airflow connection of type ``transactional`` or ``postgres``.
        Its ``schema`` field is the database; extra ``state_schema`` names the provider's schema
        (default ``airflow_txn``).
    """

    conn_name_attr = "transactional_conn_id"
    default_conn_name = "transactional_default"
    conn_type = CONNECTION_TYPE
    hook_name = HOOK_NAME

    def __init__(self, transactional_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.transactional_conn_id = transactional_conn_id
        self._conn: Any = None

    def _connection(self) -> Any:
        """The Airflow connection, fetched once per hook (in a task, each fetch is a call to Airflow's API)."""
        if self._conn is None:
            self._conn = self.get_connection(self.transactional_conn_id)
        return self._conn

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return copy.deepcopy(UI_FIELD_BEHAVIOUR)

    def _extras(self) -> dict[str, Any]:
        return dict(self._connection().extra_dejson or {})

    def get_dsn(self) -> str:
        conn = self._connection()
        return dsn_from_fields(host=conn.host, port=conn.port, login=conn.login, password=conn.password,
                               database=conn.schema, extras=self._extras())

    def state_schema(self) -> str:
        return str(self._extras().get("state_schema") or DEFAULT_SCHEMA)

    def coordinator(self, **kwargs: Any) -> Coordinator:
        """A coordinator of this store whose Kafka sources and outputs resolve Airflow's connections."""
        return Coordinator(self.get_dsn(), schema=self.state_schema(), connections=AIRFLOW_CONNECTIONS, **kwargs)

    def test_connection(self) -> tuple[bool, str]:
        """Used by the "Test" button of the connection form."""
        try:
            with self.coordinator() as coordinator:
                return True, f"connected: {coordinator.ping()}"
        except Exception as exc:  # reported to the UI, not raised
            return False, str(exc)
