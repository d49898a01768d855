"""An S3 server that keeps object versions, started by the project for the tests of a versioned
bucket: Adobe's S3Mock (Apache-2.0), one executable jar fetched from Maven Central once per machine.

S3Proxy (:mod:`dev.s3`), the project's S3 server everywhere else, keeps no versions. S3Mock keeps
every version of a key in a bucket whose versioning is enabled -- ``ListObjectVersions``, ``GET`` and
``HEAD`` by ``versionId``, delete markers -- on the local disk (``data/`` under ``base_dir``), which
outlives a restart. It was chosen over moto's server mode, which holds its objects in memory. It
checks no credentials (any signature passes): the tests give it random ones all the same, as a
real bucket's would be. It serves on a free loopback port; S3Mock also opens a second HTTP
connector on every interface, on a random port, which nothing uses.
"""

from __future__ import annotations

from pathlib import Path

from airflow_transactional.spark.jars import JarSet
from dev.embedded import free_port
from dev.s3 import S3Server

S3MOCK_VERSION = "5.2.0"
SERVER = JarSet("s3mock", (("com.adobe.testing", "s3mock", S3MOCK_VERSION, "exec"),))


class VersionedS3Server(S3Server):
    """One S3Mock on 127.0.0.1, with :class:`~dev.s3.S3Server`'s connection, client and
    ``kill()``/``restart()``/``stop(remove=True)``; ``create_bucket(name)`` enables its versioning."""

    product, server_jars = "S3Mock", SERVER

    def _argv(self, jar: Path, data: Path) -> list[str]:
        """S3Mock's settings: its store under ``data``, kept on exit; plain HTTP on loopback."""
        return [f"--com.adobe.testing.s3mock.store.root={data}",
                "--com.adobe.testing.s3mock.store.retain-files-on-exit=true", "--spring.main.banner-mode=off",
                "--server.address=127.0.0.1", "--server.ssl.enabled=false", f"--server.port={self.port}",
                f"--com.adobe.testing.s3mock.http-port={free_port()}"]

    def create_bucket(self, name: str) -> None:
        """The bucket, its versioning enabled."""
        super().create_bucket(name)
        self.client().put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})


if __name__ == "__main__":  # python -m dev.s3versioned fetch: the server's jar, once per machine
    import sys

    if sys.argv[1:] != ["fetch"]:
        raise SystemExit("usage: python -m dev.s3versioned fetch")
    print(f"S3Mock {S3MOCK_VERSION}: {', '.join(p.name for p in SERVER.fetch())} in {SERVER.directory}")
