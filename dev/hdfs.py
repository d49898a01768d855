"""A real HDFS started by the project itself, for the tests and the benchmarks: a NameNode and a
DataNode in one JVM (Hadoop's ``MiniHadoopClusterManager``, from ``hadoop-client-minicluster``,
the Hadoop of the installed PySpark), its jars fetched from Maven Central once per machine, on
free loopback ports.

Clients reach it two ways: ``hdfs://127.0.0.1:<port>`` (Spark, through the HDFS client Spark
ships) and WebHDFS on the NameNode's HTTP port (the provider's planner). Simple authentication:
the user is the one this process runs as. Layout under ``base_dir``: ``data/`` (the NameNode's and
DataNode's directories), ``server.log``, ``hdfs.json`` (the ports). ``stop(remove=True)``
deletes it all.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import time
from typing import Any
from urllib.parse import quote

from airflow_transactional import files
from airflow_transactional.spark.jars import HADOOP_VERSION, JarSet
from dev.embedded import free_port
from dev.server import Server

# The cluster manager is a test utility: it needs JUnit's API on its class path, not JUnit itself.
CLUSTER = JarSet("hadoop-minicluster", (("org.apache.hadoop", "hadoop-client-minicluster", HADOOP_VERSION),
                                        ("org.junit.jupiter", "junit-jupiter-api", "5.13.4")))

LOG4J = """\
log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={path}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d %p %c{{1}} - %m%n
"""


class HdfsCluster(Server):
    """One NameNode and one DataNode on 127.0.0.1: ``start()``, ``url``, ``webhdfs``,
    ``restart()`` for the fault tests, ``stop(remove=True)``."""

    def __init__(self, base_dir: str | os.PathLike[str], *, heap: str = "512m", listing_page: int = 1000) -> None:
        super().__init__(base_dir)
        self.heap = heap
        self.listing_page = listing_page  # entries per directory listing request (the tests page in threes)
        self.port = 0
        self.http_port = 0

    @property
    def url(self) -> str:
        """The file system's URI, as Spark reads it: ``hdfs://127.0.0.1:<port>``."""
        return f"hdfs://127.0.0.1:{self.port}"

    @property
    def webhdfs(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def connection(self) -> dict[str, Any]:
        """This cluster as an Airflow connection of type ``webhdfs``: the NameNode's HTTP address and
        the HDFS user."""
        return {"conn_type": "webhdfs", "host": "127.0.0.1", "port": self.http_port, "login": getpass.getuser()}

    def airflow_connection(self) -> str:
        return json.dumps(self.connection())

    def _call(self, method: str, path: str, op: str, data: bytes | None = None, **params: Any) -> Any:
        """A WebHDFS call as this process's user, following the NameNode's redirect to a DataNode."""
        import requests

        url = f"{self.webhdfs}/webhdfs/v1{quote(path)}"
        query = {"op": op, "user.name": getpass.getuser(), **params}
        r = requests.request(method, url, params=query, allow_redirects=False, timeout=60)
        if r.status_code == 307:
            r = requests.request(method, r.headers["Location"], data=data or b"", timeout=60)
        r.raise_for_status()
        return r

    def put(self, path: str, data: bytes) -> None:
        """Write a file at ``path`` (a path of the file system), replacing what was there."""
        self._call("PUT", path, "CREATE", data, overwrite="true")

    def append(self, path: str, data: bytes) -> None:
        self._call("POST", path, "APPEND", data)

    def delete(self, path: str) -> None:
        self._call("DELETE", path, "DELETE", recursive="true")

    def mkdirs(self, path: str) -> None:
        self._call("PUT", path, "MKDIRS")

    def shell(self, *args: str) -> None:
        """Hadoop's own shell (``hadoop fs``) on this cluster, in one JVM: many files at once (the
        benchmarks' setup)."""
        conf = self.base_dir / "client-conf"  # the shell wants a core-site.xml on its class path
        conf.mkdir(exist_ok=True)
        (conf / "core-site.xml").write_text("<configuration><property><name>fs.defaultFS</name>"
                                            f"<value>{self.url}</value></property></configuration>")
        classpath = os.pathsep.join([str(conf), *(str(j) for j in CLUSTER.fetch())])
        run = subprocess.run(["java", "-Xmx512m", "-cp", classpath, "org.apache.hadoop.fs.FsShell", *args],
                             capture_output=True, text=True, timeout=3600,
                             env={**os.environ, "HADOOP_USER_NAME": getpass.getuser()})
        if run.returncode:
            raise RuntimeError(f"hadoop fs {' '.join(args[:2])} ... failed: {run.stderr[-2000:]}")

    def start(self, timeout: float = 120) -> HdfsCluster:
        jars = CLUSTER.fetch()
        files.private_dir(self.base_dir)
        data = self.base_dir / "data"
        fresh = not data.exists()
        if not self.port:
            try:
                kept = json.loads((self.base_dir / "hdfs.json").read_text())
                self.port, self.http_port = int(kept["port"]), int(kept["http_port"])
            except (OSError, ValueError, KeyError, TypeError):
                self.port, self.http_port = free_port(), free_port()
        (self.base_dir / "log4j.properties").write_text(LOG4J.format(path=self.base_dir / "hadoop.log"))
        details = self.base_dir / "details.json"
        details.unlink(missing_ok=True)
        argv = ["java", f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                f"-Dtest.build.data={data}", f"-Dlog4j.configuration=file:{self.base_dir / 'log4j.properties'}",
                "-cp", os.pathsep.join(str(j) for j in jars), "org.apache.hadoop.mapreduce.MiniHadoopClusterManager",
                "-nomr", "-nnport", str(self.port), "-nnhttpport", str(self.http_port), "-writeDetails", str(details),
                *(["-format"] if fresh else []), "-D", "dfs.permissions.enabled=true",
                "-D", f"dfs.ls.limit={self.listing_page}", "-D", "dfs.namenode.safemode.extension=0",
                "-D", "dfs.datanode.address=127.0.0.1:0",
                "-D", "dfs.datanode.http.address=127.0.0.1:0", "-D", "dfs.datanode.ipc.address=127.0.0.1:0"]
        out = files.open_private_log(self.base_dir / "server.log")
        try:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                         start_new_session=True)
        finally:
            os.close(out)
        files.write_private(self.base_dir / "hdfs.json", json.dumps(
            {"port": self.port, "http_port": self.http_port, "pid": self.proc.pid}))
        self._wait(timeout)
        return self

    def _wait(self, timeout: float) -> None:
        """Until WebHDFS answers and the NameNode has left safe mode (its DataNode reported)."""
        import requests

        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the HDFS cluster exited ({self.proc.returncode}): "
                                   f"{(self.base_dir / 'server.log').read_text(errors='replace')[-3000:]}")
            try:
                r = requests.get(f"{self.webhdfs}/jmx", params={"qry": "Hadoop:service=NameNode,name=NameNodeInfo"},
                                 timeout=2)
                beans = r.json().get("beans") if r.ok else None
                if beans and not beans[0].get("Safemode") and (self.base_dir / "details.json").exists():
                    return
            except (requests.RequestException, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"HDFS did not serve within {timeout:.0f} s (see {self.base_dir / 'server.log'})")
            time.sleep(0.5)



if __name__ == "__main__":  # python -m dev.hdfs fetch: the cluster's jars, once per machine
    import sys

    if sys.argv[1:] != ["fetch"]:
        raise SystemExit("usage: python -m dev.hdfs fetch")
    print(f"Hadoop {HADOOP_VERSION} minicluster: {len(CLUSTER.fetch())} jars in {CLUSTER.directory}")
