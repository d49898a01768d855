"""A real S3 server started by the project itself, for the demo, the tests and the benchmarks:
S3Proxy (Apache-2.0), the S3 REST API over a local directory, its one jar fetched from Maven
Central once per machine, listening on a free loopback port with credentials of its own.

S3Proxy speaks S3's REST API with AWS v2/v4 signatures; it keeps no object versions (an ETag,
a size and a last-modified time identify what a key holds). Layout under ``base_dir``:
``s3proxy.conf`` (mode 600: the credentials are in it, never on a command line), ``data/`` (a
directory per bucket), ``server.log``, ``s3.json`` (port and credentials, mode 600, for a process
that finds the server later). ``stop(remove=True)`` deletes it all.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psycopg2

from airflow_transactional import files
from airflow_transactional.connections import settings_of
from airflow_transactional.spark.jars import JarSet
from dev.embedded import free_port
from dev.server import Server
from dev.slowlink import SlowLink

S3PROXY_VERSION = "2.9.0"
SERVER = JarSet("s3proxy", (("org.gaul", "s3proxy", S3PROXY_VERSION, "jar-with-dependencies"),))
REGION = "us-east-1"

CONFIG = """\
s3proxy.endpoint=http://127.0.0.1:{port}
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity={identity}
s3proxy.credential={credential}
s3proxy.ignore-unknown-headers=true
jclouds.provider=filesystem-nio2
jclouds.filesystem.basedir={data}
"""


class S3Server(Server):
    """One S3Proxy on 127.0.0.1: ``start()``, ``endpoint``, ``client()``, ``kill()``/``restart()``
    for the fault tests, ``stop(remove=True)``. With ``link``, clients reach it through a
    :class:`~dev.slowlink.SlowLink` (``self.link``), which the chaos harness slows down."""

    #: The server's name, in its errors, and its jar.
    product, server_jars = "S3Proxy", SERVER

    def __init__(self, base_dir: str | os.PathLike[str], *, heap: str = "256m", link: bool = False) -> None:
        super().__init__(base_dir)
        self.heap = heap
        self.port = 0
        self.identity = ""
        self.credential = ""
        self.link: SlowLink | None = SlowLink(0) if link else None

    @property
    def endpoint(self) -> str:
        """Where clients reach the server: its port, or its link's."""
        return f"http://127.0.0.1:{self.link.port if self.link is not None else self.port}"

    def connection(self) -> dict[str, Any]:
        """This server as an Airflow connection of the Amazon provider's ``aws`` type: the access key
        and secret as login and password, the endpoint, region and path-style access in the extra."""
        return {"conn_type": "aws", "login": self.identity, "password": self.credential,
                "extra": {"endpoint_url": self.endpoint, "region_name": REGION,
                          "config_kwargs": {"s3": {"addressing_style": "path"}}}}

    def settings(self) -> dict[str, Any]:
        """This server's connection as a source reads it (the access key and secret among them)."""
        conn = self.connection()
        return settings_of("aws", login=conn["login"], password=conn["password"], extra=conn["extra"])

    def server_credentials(self) -> dict[str, str]:
        """This server's credentials as a Spark Connect server's environment holds them (s3a's
        environment provider reads them): a read on Connect carries none of its own."""
        return {"AWS_ACCESS_KEY_ID": self.identity, "AWS_SECRET_ACCESS_KEY": self.credential}

    def airflow_connection(self) -> str:
        """The connection as ``AIRFLOW_CONN_<ID>`` takes it (JSON)."""
        return json.dumps(self.connection())

    def client(self) -> Any:
        """A boto3 S3 client of this server, for producers and tests."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.identity,
                            aws_secret_access_key=self.credential, region_name=REGION,
                            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2},
                                          request_checksum_calculation="when_required",
                                          response_checksum_validation="when_required"))

    def create_bucket(self, name: str) -> None:
        """The bucket, if it is not there yet (a restarted demo keeps its server's data)."""
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
            pass

    def _kept(self) -> dict[str, Any] | None:
        try:
            return dict(json.loads((self.base_dir / "s3.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def start(self, timeout: float = 90) -> S3Server:
        (jar,) = self.server_jars.fetch()
        files.private_dir(self.base_dir)
        kept = self._kept() or {}
        if not self.port:  # its last life's port and credentials: an exported connection stays good
            self.port = int(kept.get("port") or 0) or free_port()
            self.identity = str(kept.get("identity") or f"AKIA{secrets.token_hex(8).upper()}")
            self.credential = str(kept.get("credential") or secrets.token_urlsafe(30))
        if self.link is not None:  # up before the server, and through its restarts
            self.link.target_port = self.port
            self.link.start()
        argv = self._argv(jar, files.private_dir(self.base_dir / "data"))
        out = files.open_private_log(self.base_dir / "server.log")
        try:
            self.proc = subprocess.Popen(["java", f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                                          "-jar", str(jar), *argv],
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            os.close(out)
        files.write_private(self.base_dir / "s3.json", json.dumps(
            {"port": self.port, "identity": self.identity, "credential": self.credential, "pid": self.proc.pid}))
        self._wait(timeout)
        return self

    def _argv(self, jar: Path, data: Path) -> list[str]:
        """The server's arguments (after its jar), serving ``data`` on ``self.port``."""
        files.write_private(self.base_dir / "s3proxy.conf", CONFIG.format(
            port=self.port, identity=self.identity, credential=self.credential, data=data))
        return ["--properties", str(self.base_dir / "s3proxy.conf")]

    def _wait(self, timeout: float) -> None:
        """Until the server answers a signed request."""
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.product} exited ({self.proc.returncode}): "
                                   f"{(self.base_dir / 'server.log').read_text(errors='replace')[-3000:]}")
            try:
                client.list_buckets()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.product} did not serve within {timeout:.0f} s (see "
                                       f"{self.base_dir / 'server.log'})") from None
                time.sleep(0.3)

    def stop(self, *, remove: bool = False) -> None:
        if self.link is not None:
            self.link.stop()
        super().stop(remove=remove)


if __name__ == "__main__":  # python -m dev.s3 fetch: the server's jar, once per machine
    import sys

    if sys.argv[1:] != ["fetch"]:
        raise SystemExit("usage: python -m dev.s3 fetch")
    print(f"S3Proxy {S3PROXY_VERSION}: {', '.join(p.name for p in SERVER.fetch())} in {SERVER.directory}")


#: The demo's landing place: dags/s3_orders.py reads s3a://demo-landing/orders.
S3_BUCKET, S3_PREFIX = "demo-landing", "orders"


class S3Orders(threading.Thread):
    """Uploads order files to the S3 server, and now and then uploads new content under the name of a
    file a txid already committed: a new version, counted in a later txid. ``ledger``: every version
    uploaded, (key, its orders' total)."""

    def __init__(self, server: S3Server, dsn: str, interval: float = 16.0, seed: int | None = None) -> None:
        super().__init__(name="s3-orders", daemon=True)
        self.client, self.dsn, self.interval = server.client(), dsn, interval
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.ledger: list[tuple[str, int]] = []
        self.rewritten: set[str] = set()  # keys uploaded again (once: never a third version)

    def committed_key(self) -> str | None:
        """A key all of whose registered versions are committed, never rewritten before (None: none): a
        key whose newer version is still planned, rewritten, jammed its topology (S3Proxy keeps no versions)."""
        with psycopg2.connect(self.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT f.path FROM airflow_txn.landing_files f JOIN airflow_txn.topologies t USING "
                        "(topology_id) WHERE t.topology_id = 's3_orders' GROUP BY f.path, t.committed_offsets "
                        "HAVING max(f.seq) <= (t.committed_offsets->>'seq')::bigint ORDER BY random()")
            keys = [str(path).split(f"/{S3_BUCKET}/", 1)[1] for (path,) in cur.fetchall()]
        conn.close()
        key = next((k for k in keys if k not in self.rewritten), None)
        self.rewritten |= {key} if key else set()
        return key

    def run(self) -> None:
        n = 0
        while not self.stop_event.wait(self.interval):
            n += 1
            orders = [(f"u{self.rng.randint(1, 50)}", self.rng.randint(1, 500))
                      for _ in range(self.rng.randint(50, 200))]
            try:
                key = self.committed_key() if n % 5 == 0 else None  # a re-upload: a new version
                key = key or f"{S3_PREFIX}/{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{n:05d}.json"
                self.client.put_object(Bucket=S3_BUCKET, Key=key,
                                       Body="".join(json.dumps({"user": u, "amount": a}) + "\n"
                                                    for u, a in orders).encode())
                self.ledger.append((key, sum(a for _u, a in orders)))
            except Exception as exc:  # the demo goes on
                logging.warning("s3 producer: %s", exc)
