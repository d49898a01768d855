"""Jars from Maven Central that the provider hands to a JVM: Spark's Kafka connector, Hadoop's s3a
file system (and, for the development stack, the Kafka broker and the S3 and HDFS servers).

A jar set is fetched once per machine by Maven (``mvn dependency:copy-dependencies`` with strict
checksums, pinned versions) into the provider's private cache directory, and its manifest -- the
SHA-256 of every jar -- is written beside it. Every use checks the directory's whole way and every
jar against the manifest (:mod:`..files`): a jar is code a driver runs with the state store's DSN
in its environment. Where Maven cannot reach Central, a cluster gets the connector its own way
(``spark.jars.packages``, or jars on its classpath) and the provider passes none.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import files
from ..exceptions import ConfigError
from ..sources import Source

__all__ = ["JarSet", "jars_for", "kafka_connector", "kafka_jars", "s3a_connector", "s3a_jars"]

MANIFEST = "manifest.json"

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>airflow-transactional</groupId><artifactId>{name}</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencyManagement><dependencies>
{managed}
  </dependencies></dependencyManagement>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""


@dataclass(frozen=True)
class JarSet:
    """Maven artifacts and what of their runtime closure a JVM needs (``keep``: artifact names
    without version; empty: all of it). An artifact is ``(group, artifact, version)``, or with a
    fourth item, its classifier (a ``jar-with-dependencies`` is taken without its dependencies);
    ``exclude`` names ``group:artifact`` pairs left out of every artifact's closure, and ``bom`` a
    bill of materials that gives the versions of artifacts listed with version ``""``."""

    name: str
    artifacts: tuple[tuple[str, ...], ...]  # (group, artifact, version[, classifier])
    keep: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    bom: tuple[str, str, str] | None = None

    @property
    def directory(self) -> Path:
        identity: list[Any] = [self.artifacts, self.keep]
        if self.exclude or self.bom:
            identity += [self.exclude, self.bom]
        tag = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:12]
        return files.cache_dir() / "jars" / f"{self.name}-{tag}"

    def find(self) -> list[Path] | None:
        """The set's jars, each checked against the manifest; None when it was never fetched."""
        home = self.directory
        files._check_chain(home)
        manifest = home / MANIFEST
        if not manifest.is_file():
            return None
        digests: dict[str, str] = json.loads(manifest.read_text())
        jars = []
        for name, digest in sorted(digests.items()):
            path = home / name
            if not files._trusted(path, digest):
                raise ConfigError(f"{path} is not the jar Maven fetched (its digest, owner or mode changed): remove "
                                  f"{home} and fetch it again (airflow-txn fetch-jars {self.name})")
            jars.append(path)
        return jars

    def pom(self) -> str:
        """The Maven project whose runtime dependencies are the set."""
        managed = ""
        if self.bom is not None:
            g, a, v = self.bom
            managed = (f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
                       "<type>pom</type><scope>import</scope></dependency>")
        dependencies = []
        for g, a, v, *classifier in self.artifacts:
            excluded = [e.split(":", 1) for e in self.exclude]
            if classifier:  # a jar with its dependencies inside: none of them again
                excluded = [["*", "*"]]
            exclusions = "".join(f"<exclusion><groupId>{eg}</groupId><artifactId>{ea}</artifactId></exclusion>"
                                 for eg, ea in excluded)
            dependencies.append(
                f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
                + (f"<version>{v}</version>" if v else "")
                + (f"<classifier>{classifier[0]}</classifier>" if classifier else "")
                + (f"<exclusions>{exclusions}</exclusions>" if exclusions else "") + "</dependency>")
        return POM.format(name=self.name, managed=managed, dependencies="\n".join(dependencies))

    def fetch(self, *, mvn: str = "mvn") -> list[Path]:
        """The set's jars, fetched with Maven first when missing."""
        found = self.find()
        if found is not None:
            return found
        if shutil.which(mvn) is None:
            raise ConfigError(f"fetching {self.name} needs Maven (mvn) on the PATH: install it (apt-get install "
                              "maven), or give the cluster the jars its own way (spark.jars.packages)")
        home = files.private_dir(self.directory)
        with tempfile.TemporaryDirectory(prefix="fetch-", dir=home) as work:
            Path(work, "pom.xml").write_text(self.pom())
            out = Path(work, "jars")
            run = subprocess.run([mvn, "-q", "-B", "--strict-checksums", "dependency:copy-dependencies",
                                  f"-DoutputDirectory={out}", "-DincludeScope=runtime"], cwd=work,
                                 capture_output=True, text=True, timeout=1800)
            if run.returncode:
                tail = (run.stdout + run.stderr).strip().splitlines()[-15:]
                wanted = ", ".join(":".join(a) for a in self.artifacts)
                raise ConfigError(f"Maven could not fetch {self.name} ({wanted}); it said:\n" + "\n".join(tail))
            digests = {}
            for jar in sorted(out.glob("*.jar")):
                if self.keep and not any(jar.name.startswith(f"{k}-") for k in self.keep):
                    continue
                target = home / jar.name
                files.write_private(target, jar.read_bytes())
                digests[jar.name] = hashlib.sha256(target.read_bytes()).hexdigest()
            files.write_private(home / MANIFEST, json.dumps(digests, indent=1))
        found = self.find()
        assert found is not None
        return found


def spark_version() -> str:
    """The installed PySpark's version: the connector must match it."""
    return metadata.version("pyspark")


def kafka_connector() -> JarSet:
    """Spark's Kafka connector for the installed Spark, without what Spark ships already."""
    return JarSet("spark-kafka", (("org.apache.spark", "spark-sql-kafka-0-10_2.13", spark_version()),),
                  keep=("spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients",
                        "commons-pool2"))


def kafka_jars(conf: Mapping[str, Any]) -> list[str]:
    """The connector's jars for a Kafka topology's ``spark-submit`` (``--jars``): none when the
    Spark settings give the cluster its own (``spark.jars.packages`` or ``spark.jars`` naming it)."""
    return _unless_given(conf, "spark-sql-kafka", kafka_connector(), (
        "a Kafka topology's Spark job needs Spark's Kafka connector: run 'airflow-txn fetch-jars' on this machine "
        "(it uses Maven), or set spark_conf={'spark.jars.packages': "
        f"'org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version()}'}}"))


def _unless_given(conf: Mapping[str, Any], artifact: str, jars: JarSet, missing: str) -> list[str]:
    """The paths of ``jars``, or none when ``spark.jars.packages`` or ``spark.jars`` names ``artifact``
    already; ``missing``: the error when they were never fetched."""
    given = " ".join(str(conf.get(key, "")) for key in ("spark.jars.packages", "spark.jars"))
    if artifact in given:
        return []
    found = jars.find()
    if found is None:
        raise ConfigError(missing)
    return [str(p) for p in found]


#: The Hadoop of the installed PySpark's ``hadoop-client-api`` jar: hadoop-aws must match it.
HADOOP_VERSION = "3.5.0"
#: The AWS SDK v2 release whose modules s3a takes (its bill of materials pins each module).
AWS_SDK_BOM = ("software.amazon.awssdk", "bom", "2.57.8")
_SDK = "software.amazon.awssdk"


def s3a_connector() -> JarSet:
    """Hadoop's s3a file system with the few AWS SDK modules it uses (S3, STS, the HTTP clients, the
    transfer manager), not the SDK's bundle of every service (hundreds of MB); without what Spark
    ships already (netty, Apache HttpClient 4, commons-codec, SLF4J)."""
    return JarSet("hadoop-aws", (("org.apache.hadoop", "hadoop-aws", HADOOP_VERSION), (_SDK, "s3", ""),
                                 (_SDK, "sts", ""), (_SDK, "apache-client", ""), (_SDK, "s3-transfer-manager", "")),
                  exclude=(f"{_SDK}:bundle",), bom=AWS_SDK_BOM,
                  keep=("hadoop-aws", "analyticsaccelerator-s3", "annotations", "apache-client", "apache5-client",
                        "arns", "auth", "aws-core", "aws-query-protocol", "aws-xml-protocol", "checksums",
                        "crt-core", "endpoints-spi", "eventstream", "http-auth", "http-client-spi", "httpclient5",
                        "httpcore5", "identity-spi", "json-utils", "metrics-spi", "netty-nio-client", "profiles",
                        "protocol-core", "reactive-streams", "regions", "retries", "s3", "sdk-core", "sts",
                        "third-party-jackson-core", "utils", "wildfly-openssl"))


def s3a_jars(conf: Mapping[str, Any]) -> list[str]:
    """The s3a jars for a job that reads ``s3a://`` (``--jars``): none when the Spark settings give
    the cluster its own (``spark.jars.packages`` or ``spark.jars`` naming hadoop-aws)."""
    return _unless_given(conf, "hadoop-aws", s3a_connector(), (
        "a topology landing on S3 needs Hadoop's s3a jars: run 'airflow-txn fetch-jars' on this machine (it uses "
        f"Maven), or set spark_conf={{'spark.jars.packages': 'org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}'}} (with "
        "the AWS SDK bundle)"))


#: The jars of each connector a source may name (``Source.spark_connectors``), given the Spark settings.
CONNECTORS: dict[str, Callable[[Mapping[str, Any]], list[str]]] = {"kafka": kafka_jars, "s3a": s3a_jars}


def jars_for(source: Source, conf: Mapping[str, Any]) -> list[str]:
    """The jars a job reading ``source`` needs beyond Spark's own: those of the connectors it names
    (the Kafka connector for a topic, s3a for a landing directory on S3)."""
    return [jar for name in source.spark_connectors() for jar in CONNECTORS[name](conf)]
