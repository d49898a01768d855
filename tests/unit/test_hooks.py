"""hooks.py and the provider's registration with Airflow: a connection becomes a DSN from
allowlisted fields only; the connection type and its form come from the provider info."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from airflow_transactional import get_provider_info
from airflow_transactional.airflow.hooks import dsn_from_fields

pytestmark = pytest.mark.unit


def test_hook_builds_a_dsn_from_allowlisted_fields_only() -> None:
    dsn = dsn_from_fields(host="db", port=6543, login="app", password="s3cret", database="analytics",
                          extras={"sslmode": "require", "state_schema": "x", "sslcompression": "1",
                                  "host": "evil"})
    parts = dict(p.split("=", 1) for p in dsn.split())
    assert parts == {"host": "db", "port": "6543", "dbname": "analytics", "user": "app",
                     "password": "s3cret", "sslmode": "require"}


def test_provider_registers_its_connection_type_and_hook() -> None:
    info = get_provider_info()
    assert info["package-name"] == "airflow-provider-transactional"
    [conn_type] = info["connection-types"]
    assert conn_type["connection-type"] == "transactional"
    assert conn_type["hook-class-name"] == "airflow_transactional.airflow.hooks.TransactionalHook"
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    assert "airflow-provider-transactional" in ProvidersManager().providers
    hook = ProvidersManagerTaskRuntime().hooks["transactional"]
    assert hook is not None
    assert hook.hook_class_name == "airflow_transactional.airflow.hooks.TransactionalHook"
    assert hook.connection_testable


def test_connection_form_metadata_comes_from_provider_info_without_importing_the_hook() -> None:
    # Airflow 3.3's UI builds the "Add connection" form from provider info alone; a fresh
    # process must show our name and labels even though nothing imported the hook yet.
    probe = textwrap.dedent("""
        import json, sys
        from airflow.providers_manager import ProvidersManager
        [meta] = [m for m in ProvidersManager().iter_connection_type_hook_ui_metadata()
                  if m.connection_type == "transactional"]
        print(json.dumps({"hook_name": meta.hook_name, "behaviour": meta.field_behaviour,
                          "hook_imported": "airflow_transactional.airflow.hooks" in sys.modules}))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    from airflow_transactional.airflow.hooks import TransactionalHook

    assert got["hook_imported"] is False
    assert got["hook_name"] == TransactionalHook.hook_name == "Transactional state store (PostgreSQL)"
    assert got["behaviour"] == TransactionalHook.get_ui_field_behaviour()
    assert got["behaviour"]["relabeling"] == {"schema": "Database"}
