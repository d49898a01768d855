"""A landing directory on the tests' S3 server or HDFS, and what a producer does to its files."""

from __future__ import annotations

import uuid
from typing import Any

from airflow_transactional.spark.jars import s3a_connector


class Place:
    """A fresh bucket (S3) or directory (HDFS) named for one test; ``url`` and ``conn_id`` declare it."""

    def __init__(self, kind: str, server: Any) -> None:
        self.kind, self.server = kind, server
        name = f"t{uuid.uuid4().hex[:10]}"
        if kind == "s3":
            server.create_bucket(name)
            self.bucket, self.url, self.conn_id = name, f"s3a://{name}/in", None
        else:
            self.dir = f"/{name}/in"
            server.mkdirs(self.dir)
            self.url, self.conn_id = f"{server.url}{self.dir}", "webhdfs_test"

    def put_lines(self, name: str, lines: list[str]) -> None:
        self.put_bytes(name, "".join(line + "\n" for line in lines).encode())

    def put_bytes(self, name: str, data: bytes) -> None:
        if self.kind == "s3":
            self.server.client().put_object(Bucket=self.bucket, Key=f"in/{name}", Body=data)
        else:
            self.server.put(f"{self.dir}/{name}", data)

    def delete(self, name: str) -> None:
        if self.kind == "s3":
            self.server.client().delete_object(Bucket=self.bucket, Key=f"in/{name}")
        else:
            self.server.delete(f"{self.dir}/{name}")

    def jars(self) -> list[str]:
        """What a spark-submit reading it needs beyond Spark: s3a for S3."""
        return [str(p) for p in s3a_connector().fetch()] if self.kind == "s3" else []
