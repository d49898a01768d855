"""ui/actions.py: the form token that tells a confirmed action from a forged post, and where the
plugin finds this api-server's own REST API."""

from __future__ import annotations

import pytest

from airflow_transactional.ui import actions

pytestmark = pytest.mark.unit


def test_a_form_token_is_bound_to_the_user_the_action_and_its_target() -> None:
    token = actions.form_token("jwt-of-alice", "clear", "words", "run-1")
    assert actions.form_token_ok("jwt-of-alice", "clear", "words", "run-1", token)
    for other in (("jwt-of-bob", "clear", "words", "run-1"), ("jwt-of-alice", "reprocess", "words", "run-1"),
                  ("jwt-of-alice", "clear", "clicks", "run-1"), ("jwt-of-alice", "clear", "words", "run-2")):
        assert not actions.form_token_ok(*other, token), other
    for forged in (None, "", "0" * 64, token[:-1]):
        assert not actions.form_token_ok("jwt-of-alice", "clear", "words", "run-1", forged)
    # A field separator in a name cannot make two different targets sign alike.
    assert actions.form_token("k", "clear", "a", "b/c") != actions.form_token("k", "clear", "a/b", "c")


def test_the_api_url_is_the_api_server_itself_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__API__HOST", "0.0.0.0")
    monkeypatch.setenv("AIRFLOW__API__PORT", "9091")
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/team/airflow/")
    monkeypatch.delenv("AIRFLOW__API__SSL_CERT", raising=False)
    # Behind a proxy the public address may not be reachable from the server: loopback, same path.
    assert actions.api_url() == "http://127.0.0.1:9091/team/airflow"
    monkeypatch.setenv("AIRFLOW__TRANSACTIONAL__API_URL", "http://airflow-api.internal:8080/")
    assert actions.api_url() == "http://airflow-api.internal:8080"


def test_the_credential_goes_unverified_only_to_the_loopback_api_server() -> None:
    for base, verified in (("https://127.0.0.1:8080", False), ("http://localhost:8080/airflow", False),
                           ("https://airflow-api.internal:8080", True)):
        with actions.AirflowApi("jwt", base) as api:
            context = api._client._transport._pool._ssl_context  # what httpx hands to the TLS layer
            assert (context.verify_mode.name == "CERT_REQUIRED") == verified, base
