"""Who may see and do what in the Transactions views, in an Airflow whose auth manager restricts
DAGs: multi-team mode, two DAG bundles owned by two teams, and users who belong to one team. A
user without access to a DAG cannot learn that its topology exists; a Viewer may look but not act;
a User of a team may preview actions on that team's topologies only. The stack is its own (multi-
team mode changes how Airflow resolves every DAG's owner), started only for this module."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional import EventLog
from airflow_transactional.coordinator import Coordinator
from dev.localstack import LocalStack, RestClient, quiet_daily_schedule
from tests.e2e.conftest import wait_for_runs

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DAG = """from airflow_transactional import PostgresLogSource, StateSpec, transactional_dag

{name} = transactional_dag(
    "{name}",
    source=PostgresLogSource("{name}"),
    states=[StateSpec("global_count", keys={{"id": "text"}}, combiner="count", table="{name}")],
    application="{app}",
    schedule="{schedule}",
)
"""
TEAMS = {"team_a": "alpha", "team_b": "beta"}  # each team's bundle holds one topology
READER, OPERATOR = "alice", "bob"  # alice: Viewer of team_a; bob: User of team_a


@pytest.fixture(scope="module")
def teams_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    base = tmp_path_factory.mktemp("airflow-teams")
    folders = {}
    for team, name in TEAMS.items():
        folders[team] = base / f"{team}-dags"
        folders[team].mkdir()
        (folders[team] / f"{name}.py").write_text(
            DAG.format(name=name, app=REPO / "spark_jobs" / "global_count.py", schedule=quiet_daily_schedule()))
    (base / "dags").mkdir()
    st = LocalStack(base, base / "dags", parallelism=2, teams=folders,
                    users={READER: "viewer:team_a", OPERATOR: "user:team_a"})
    try:
        st.start()
        yield st
    finally:
        st.stop(remove=True)


def _get(stack: LocalStack, path: str, token: str) -> tuple[int, Any]:
    req = urllib.request.Request(stack.url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read().decode()
            code = resp.status
    except urllib.error.HTTPError as exc:
        raw, code = exc.read().decode(errors="replace"), exc.code
    try:
        return code, json.loads(raw)
    except ValueError:
        return code, raw


def _post(stack: LocalStack, path: str, token: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(stack.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_user_sees_and_acts_on_the_topologies_of_their_team_only(teams_stack: LocalStack) -> None:
    stack, admin = teams_stack, teams_stack.client()
    runs: dict[str, str] = {}
    for name in TEAMS.values():  # empty logs: the scheduled first run commits the empty txid 1
        EventLog(stack.state_dsn, name).create(1)
        admin.wait_for_dag(name)
        admin.unpause(name)
    for name in TEAMS.values():
        deadline = time.monotonic() + 180
        while not (scheduled := admin.runs(name)):
            assert time.monotonic() < deadline, f"Airflow scheduled no run of {name}"
            time.sleep(2)
        runs[name] = str(scheduled[0]["dag_run_id"])
        wait_for_runs(stack, name, [runs[name]])
    coord = Coordinator(stack.state_dsn)
    assert {s.topology_id for s in coord.topologies()} == {"alpha", "beta"}
    coord.close()

    def listed(client: RestClient) -> list[str]:
        code, body = _get(stack, "/transactional/api/topologies", client.token())
        assert code == 200, body
        return [t["topology_id"] for t in body]

    reader, operator = stack.client(READER), stack.client(OPERATOR)
    assert listed(admin) == ["alpha", "beta"]
    # Airflow itself agrees on who sees what: the plugin asks the same auth manager.
    assert [d["dag_id"] for d in reader.get("/api/v2/dags")["dags"]] == ["alpha"]
    for client in (reader, operator):
        assert listed(client) == ["alpha"]
        token = client.token()
        for path in ("/transactional/api/dags/beta", "/transactional/dags/beta",
                     f"/transactional/api/dags/beta/runs/{runs['beta']}",
                     f"/transactional/dags/beta/runs/{runs['beta']}",
                     f"/transactional/api/dags/beta/runs/{runs['beta']}/quarantine.csv",
                     f"/transactional/dags/beta/runs/{runs['beta']}/clear", "/transactional/dags/beta/reprocess"):
            code, body = _get(stack, path, token)
            assert code == 403 and "beta" not in json.dumps(body), (path, body)
        code, body = _post(stack, "/transactional/api/dags/beta/reprocess", token, {"dry_run": True})
        assert code == 403, body
        code, body = _get(stack, "/transactional/api/dags/alpha", token)
        assert code == 200 and body["summary"]["committed_txid"] == 1, body
        assert "<svg" in _get(stack, "/transactional/dags/alpha", token)[1]

    # Acting takes what Airflow asks for the same action: a Viewer's preview is refused by
    # Airflow; a User of the team gets it (here: nothing failed, so nothing to clear).
    clear = f"/transactional/api/dags/alpha/runs/{runs['alpha']}/clear"
    code, body = _post(stack, clear, reader.token(), {"dry_run": True})
    assert code == 403 and "may not" in body["detail"], body
    code, body = _post(stack, clear, operator.token(), {"dry_run": True})
    assert code == 200 and body["tasks"] == [] and body["txid"] == 1, body
    assert body["effect"].startswith("Nothing to clear")
    code, body = _post(stack, "/transactional/api/dags/alpha/reprocess", operator.token(), {"dry_run": True})
    assert code == 200 and body["problem"] and body["runs"] == [], body
    # The correction page offers its Trigger button to whoever may trigger the DAG's runs only
    # (regression: a Viewer was offered it, and Airflow then refused).
    code, page = _get(stack, "/transactional/dags/alpha/correct?txids=1..1", reader.token())
    assert code == 200 and "Trigger the correction" not in page and "your role does not have" in page, page
    code, page = _get(stack, "/transactional/dags/alpha/correct?txids=1..1", operator.token())
    assert code == 200 and "Trigger the correction of txids 1..1" in page, page
