"""ui/actions.py: the form token that tells a confirmed action from a forged post, and where the
plugin finds this api-server's own REST API."""

from __future__ import annotations

import pytest

from airflow_transactional.airflow.ui import actions

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


def test_a_nul_in_a_dag_or_run_id_is_a_bad_request_and_every_answer_carries_the_security_headers() -> None:
    """Regression: a NUL in a path or query reached the metadata database and gave a 500."""
    from fastapi.testclient import TestClient

    from airflow_transactional.airflow.ui.app import SECURITY_HEADERS
    from airflow_transactional.airflow.ui.server import create_app

    client = TestClient(create_app(), raise_server_exceptions=False)
    for url in ("/api/dags/wor%00ds", "/dags/words/runs/r%00un", "/dags/words?backfill=1&x=%00",
                "/api/dags/words/runs/x/quarantine.csv?reason=a%00b"):
        answer = client.get(url)
        assert answer.status_code == 400, url
        assert "NUL" in answer.text
        assert {k: answer.headers.get(k) for k in SECURITY_HEADERS} == SECURITY_HEADERS
    answer = client.get("/api/topologies")  # no user: refused, and still with the headers
    assert answer.status_code in (401, 403)
    assert {k: answer.headers.get(k) for k in SECURITY_HEADERS} == SECURITY_HEADERS


@pytest.mark.parametrize(("cell", "safe"), [
    ("=HYPERLINK(\"http://evil\")", "'=HYPERLINK(\"http://evil\")"), ("+1+1", "'+1+1"), ("-2", "'-2"),
    ("@SUM(A1)", "'@SUM(A1)"), ("\tcmd", "'\tcmd"), ("plain text", "plain text"), (7, 7), (None, None),
])
def test_quarantine_csv_cells_cannot_start_a_formula(cell: object, safe: object) -> None:
    from airflow_transactional.airflow.ui.app import csv_cell

    assert csv_cell(cell) == safe


def _plan(**kw: object) -> dict[str, object]:
    return {"dag_id": "words", "topology": "words", "txids": [2, 4], "refused": None, "committed_txid": 9,
            "originals": [2, 3, 4], "corrections": [], "records": 600, "outputs": [],
            "states": {"url_counts": {"keys": 12, "total": 600}}, "preview": None, **kw}


def test_the_correction_page_offers_its_button_only_when_the_correction_is_not_refused() -> None:
    from airflow_transactional.airflow.ui import correct

    page = correct.render("/transactional", _plan(), "tok")
    assert "class=confirm" in page and "value='tok'" in page and "Not previewed yet" in page
    assert "<td class=num>12</td>" in page or ">12<" in page
    refused = correct.render("/transactional", _plan(refused="txid 6 replays <script>x</script>"), None)
    assert "class=confirm" not in refused and "<script>" not in refused and "&lt;script&gt;" in refused
    preview = {"states": {"url_counts": {"changed": 2, "old_total": 600, "new_total": 600,
                                         "samples": [["<b>", 1, 0]]}},
               "nondeterministic": True, "previewed_at": "2026-11-29T10:00:00+00:00"}
    shown = correct.render("/transactional", _plan(preview=preview), "tok")
    assert "not deterministic" in shown and "&lt;b&gt;: 1 -&gt; 0" in shown
