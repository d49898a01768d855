"""dev/embedded.py: the embedded PostgreSQL needs a password for every connection, over a socket
in a private directory; a cluster made by older code with ``trust`` is upgraded in place."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import psycopg2
import pytest

from dev.embedded import EmbeddedPostgres

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
        EmbeddedPostgres(tmp_path / "old").stop()
    assert not socket_dir.exists()  # nothing left in the temp directory
