"""cli/, ``airflow-txn``: one-line errors without secrets, the DSN from a private file, the
commit log as a table or JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from tests.helpers import click, counting_topology, make_log, run_one

pytestmark = pytest.mark.integration


def test_cli_errors_are_one_line_without_secrets(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["--dsn", "postgresql://u:s3cr%zzet@127.0.0.1/db", "status", "x"]) == 1
    err = capsys.readouterr().err
    assert "s3cr" not in err and "malformed" in err and "Traceback" not in err and err.count("\n") == 1
    assert cli(["--dsn", dsn, "--schema", "Bad", "status", "x"]) == 1
    assert "invalid schema name 'Bad'" in capsys.readouterr().err
    assert cli(["--dsn", dsn, "commits", "nosuch"]) == 1
    assert "topology 'nosuch' is not registered" in capsys.readouterr().err
    assert cli(["--dsn", "host=127.0.0.1 port=1 dbname=x user=u password=s3cret", "status", "x"]) == 1
    err = capsys.readouterr().err
    assert "s3cret" not in err and "Connection refused" in err


def test_cli_reads_the_dsn_from_a_private_file(coordinator: Coordinator, dsn: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    make_log(dsn)
    coordinator.register(counting_topology())
    dsn_file = tmp_path / "dsn"
    dsn_file.write_text(dsn + "\n")
    os.chmod(dsn_file, 0o644)
    assert cli(["--dsn-file", str(dsn_file), "status", "clicks"]) == 1
    assert f"chmod 600 {dsn_file}" in capsys.readouterr().err
    os.chmod(dsn_file, 0o600)
    assert cli(["--dsn-file", str(dsn_file), "status", "clicks"]) == 0


def test_cli_commits_is_a_table_or_json_and_survives_a_closed_pipe(coordinator: Coordinator, dsn: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    make_log(dsn).append([click(i) for i in range(120)])
    coordinator.register(counting_topology())
    for n in range(3):
        run_one(coordinator, "clicks", f"r{n}")
    assert cli(["--dsn", dsn, "commits", "clicks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["txid", "attempt"] and [ln.split()[0] for ln in lines[1:]] == ["1", "2", "3"]
    assert cli(["--dsn", dsn, "commits", "clicks", "--json"]) == 0
    assert [json.loads(ln)["txid"] for ln in capsys.readouterr().out.splitlines()] == [1, 2, 3]
    airflow_txn = str(Path(sys.executable).with_name("airflow-txn"))
    res = subprocess.run(f"'{airflow_txn}' commits clicks | head -1", shell=True, capture_output=True, text=True,
                         env={**os.environ, "AIRFLOW_TXN_DSN": dsn}, check=False)
    assert res.stdout.startswith("  txid") and "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr


@pytest.mark.parametrize(("source", "fix"), [
    ("def broken(:\n", "does not parse: invalid syntax (line 1): fix the file"),
    ("raise SystemExit(3)\n", "exited while loading (SystemExit 3)"),
    ("raise KeyboardInterrupt\n", "was interrupted while loading (KeyboardInterrupt)"),
    ("import os\nos._exit(0)\n", "exited through os._exit (code 0) while loading"),
    ("import no_such_module_here\n", "failed to load: ModuleNotFoundError: No module named 'no_such_module_here'"),
    ("x = 1\n", "declares no transactional topology"),
])
def test_register_of_a_dag_file_that_does_not_load_says_why_in_one_line(
        dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str, fix: str) -> None:
    """Regression: a syntax error gave a traceback, and ``raise SystemExit(3)`` a silent exit 3."""
    dag_file = tmp_path / "dag.py"
    dag_file.write_text(source)
    assert cli(["--dsn", dsn, "register", str(dag_file)]) == 1
    err = capsys.readouterr().err
    assert fix in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_cli_status_says_a_topology_is_stalled_and_how_long_its_next_txid_has_waited(
        coordinator: Coordinator, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses
    import time

    make_log(dsn).append([click(i) for i in range(30)])
    coordinator.register(dataclasses.replace(counting_topology(), stall_after_seconds=1))
    coordinator.plan("clicks", "r1")
    time.sleep(1.2)
    assert cli(["--dsn", dsn, "status", "clicks"]) == 2  # blocked, as for a failed txid: a monitor's check fails
    out = capsys.readouterr().out
    assert "blocked by      stalled: no commit since txid 1 was planned 1 s ago (stall_after 1 s) while the " \
           "source holds 30 records; txid 1 planned for 1 s" in out
    assert "  txid 1      planned for 1 s  run r1  plan v1, 0 attempt(s)" in out
    assert cli(["--dsn", dsn, "status", "clicks", "--json"]) == 2
    shown = json.loads(capsys.readouterr().out)
    assert shown["stalled"] is True and shown["in_flight"][0]["since"].startswith("20")


def test_the_status_of_a_topology_on_s3_reads_its_connection_from_the_private_dsn_file(
        coordinator: Coordinator, dsn: str, s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: in the demo's shell `airflow-txn status s3_orders` failed -- the S3 connection (it
    holds a secret) was not exported -- and the error called aws_default a Kafka connection. A DSN
    file (mode 600) may keep a source's connection beside the DSN, as a driver's does."""
    from airflow_transactional import LandingDirectory, StateSpec, TopologySpec
    from airflow_transactional.connections import Connections, settings_of

    conn = s3_server.connection()
    settings = settings_of("aws", login=conn["login"], password=conn["password"], extra=conn["extra"])
    s3_server.create_bucket("clistatus")
    spec = TopologySpec("s3_status", LandingDirectory("s3a://clistatus/in", conn_id="aws_cli"),
                        [StateSpec("s3_status_counts", {"k": "text"}, combiner="count")])
    Coordinator(dsn, connections=Connections(known={"aws_cli": settings})).register(spec)
    monkeypatch.delenv("AIRFLOW_CONN_AWS_CLI", raising=False)

    bare = tmp_path / "bare.dsn"
    bare.write_text(dsn)
    bare.chmod(0o600)
    assert cli(["--dsn-file", str(bare), "status", "s3_status"]) == 1
    said = capsys.readouterr().err
    assert "no connection 'aws_cli'" in said and "Kafka connection" not in said
    assert '{"dsn": ..., "connections": {"aws_cli": {...}}}' in said

    kept = tmp_path / "state.dsn"
    kept.write_text(json.dumps({"dsn": dsn, "connections": {"aws_cli": settings}}))
    kept.chmod(0o600)
    assert cli(["--dsn-file", str(kept), "status", "s3_status"]) == 0
    out = capsys.readouterr().out
    assert "s3_status" in out and "unknown" not in out.lower(), out
