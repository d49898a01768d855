"""What the operations tests do as an operator would: start a topology, inject faults, post to
the plugin's API as a script and as a browser does, and run the CLI."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from airflow_transactional import EventLog
from airflow_transactional.coordinator import Coordinator
from dev.localstack import LocalStack, RestClient
from tests.e2e.conftest import task_log, wait_for_runs


def set_faults(stack: LocalStack, *lines: str) -> None:
    """Inject the fault points ``lines`` (none: clear them) into every process the stack starts next."""
    Path(stack.extra_env["AIRFLOW_TXN_FAULTS_FILE"]).write_text("".join(f"{line}\n" for line in lines))


def runs_by_txid(coord: Coordinator, runs: list[str], dag: str) -> dict[int, str]:
    out = {}
    for r in runs:
        txn = coord.transaction_for_run(dag, r)
        assert txn is not None, f"run {r} was never planned"
        out[txn.txid] = r
    return out


def plugin_post(stack: LocalStack, path: str, token: str, body: Any) -> tuple[int, Any]:
    """(status, JSON) of a POST to the plugin's API with a bearer token, as a script sends it."""
    req = urllib.request.Request(stack.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def browser(stack: LocalStack, method: str, path: str, token: str,
             form: dict[str, str] | None = None) -> tuple[int, str, str | None]:
    """(status, body, Location) of a request as the UI's browser sends it: the session cookie,
    a form post, redirects not followed."""
    conn = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=120)
    headers = {"Cookie": f"_token={token}"}
    data = None
    if form is not None:
        data = urllib.parse.urlencode(form)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    out = (resp.status, resp.read().decode(), resp.getheader("Location"))
    conn.close()
    return out


def cli_with_env(env: dict[str, str], argv: list[str]) -> int:
    """``airflow-txn`` in a subprocess with extra environment (faults for its Spark job)."""
    res = subprocess.run([sys.executable, "-m", "airflow_transactional.cli", *argv], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=600)
    if res.returncode:
        print(res.stdout, res.stderr[-3000:])
    return res.returncode


def start_topology(stack: LocalStack, client: RestClient, dag: str, log_name: str,
           partitions: int) -> tuple[EventLog, Coordinator]:
    """Create the topology's (empty) log and unpause it. Airflow schedules one run at once on
    unpausing; with an empty log that run is the empty txid 1, committed by its plan task."""
    log = EventLog(stack.state_dsn, log_name)
    log.create(partitions)
    client.wait_for_dag(dag)
    client.unpause(dag)
    deadline = time.monotonic() + 120
    while not (scheduled := client.runs(dag)):
        assert time.monotonic() < deadline, f"Airflow scheduled no run of {dag} after unpausing it"
        time.sleep(2)
    assert set(wait_for_runs(stack, dag, [str(r["dag_run_id"]) for r in scheduled]).values()) == {"success"}
    # An empty batch with nothing before it: its plan task committed it, its commit task found it so.
    first = str(scheduled[0]["dag_run_id"])
    assert "committed txid 1 (empty batch)" in task_log(stack, dag, first, "plan")
    assert "txid 1 already committed" in task_log(stack, dag, first, "commit")
    return log, Coordinator(stack.state_dsn)


def http_get(stack: LocalStack, path: str, token: str | None) -> tuple[int, str]:
    """(status, body) of a GET as a browser or script would send it."""
    req = urllib.request.Request(stack.url + path)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
