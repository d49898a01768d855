"""A real Apache Kafka broker started by the project itself, for the demo, the tests and the
benchmarks: one KRaft node (broker and controller in one process, no ZooKeeper), its jars
fetched from Maven Central once per machine, listening on free loopback ports.

Layout under ``base_dir``: ``server.properties``, ``log4j2.properties``, ``data/`` (the logs and
the cluster's metadata), ``broker.log`` (the JVM's output), ``kafka.json`` (the port, for a
process that finds the broker later). ``stop(remove=True)`` deletes it all.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import subprocess
import time
import uuid
from typing import Any

from airflow_transactional import files
from airflow_transactional.spark.jars import JarSet
from dev.embedded import free_port
from dev.server import Server

log = logging.getLogger(__name__)
#: librdkafka's own log lines (a broker restarting is loud), for the clients below
QUIET = logging.getLogger("dev.kafka.librdkafka")
QUIET.setLevel(logging.CRITICAL)

#: The broker's version: Kafka 4 (KRaft only). Its clients of 3.9 (Spark's connector) speak to it.
KAFKA_VERSION = "4.1.1"
BROKER = JarSet("kafka-broker", (("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),))

# Small segments and a quick retention check: tests delete records and watch retention act.
SERVER = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data}
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.segment.bytes=1048576
log.retention.check.interval.ms=5000
transaction.abort.timed.out.transaction.cleanup.interval.ms=5000
"""

LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d %p %c{{1}} - %m%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
"""


def cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's Uuid text).

    Like Kafka's own ``Uuid.randomUuid``, never one that starts with ``-``: a command line would
    read it as an option (one id in 64 did, and the broker's storage was never formatted)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


class KafkaBroker(Server):
    """One KRaft node on 127.0.0.1: ``start()``, ``bootstrap``, ``kill()``/``restart()`` for the
    fault tests, ``stop(remove=True)``."""

    stop_seconds = 60  # a broker flushes its logs before it exits

    def __init__(self, base_dir: str | os.PathLike[str], *, heap: str = "512m") -> None:
        super().__init__(base_dir)
        self.heap = heap
        self.port = 0
        self.controller = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client_config(self) -> dict[str, Any]:
        """What a client sets to reach the broker (the ``extra`` of a ``kafka`` connection)."""
        return {"bootstrap.servers": self.bootstrap}

    def airflow_connection(self) -> str:
        """The ``kafka_default`` connection of this broker, as ``AIRFLOW_CONN_KAFKA_DEFAULT`` takes it."""
        return json.dumps({"conn_type": "kafka", "extra": self.client_config()})

    def create_topic(self, name: str, partitions: int, **config: str) -> None:
        """The topic, if it is not there yet (a restarted demo keeps its broker's data)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.client_config(), logger=logging.getLogger("dev.kafka.librdkafka"))
        if name not in admin.list_topics(timeout=30).topics:
            admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result(60)

    def _kept_ports(self) -> tuple[int, int] | None:
        """The (broker, controller) ports this directory's broker had, if both are free now."""
        try:
            kept = json.loads((self.base_dir / "kafka.json").read_text())
            ports = int(kept["port"]), int(kept["controller"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        for port in ports:
            with socket.socket() as s:
                # As the broker binds (Java's server sockets reuse the address): a port whose last
                # life's connections linger in TIME-WAIT after a quick restart is free to listen on
                # again; one another process listens on is not.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    return None
        return ports

    def start(self, timeout: float = 120) -> KafkaBroker:
        jars = BROKER.fetch()
        files.private_dir(self.base_dir)
        data = self.base_dir / "data"
        fresh = not (data / "meta.properties").exists()
        if not self.port:  # the ports of its last life when they are free: an exported connection stays good
            self.port, self.controller = self._kept_ports() or (free_port(), free_port())
        (self.base_dir / "server.properties").write_text(SERVER.format(port=self.port, controller=self.controller,
                                                                       data=data))
        (self.base_dir / "log4j2.properties").write_text(LOG4J.format(path=self.base_dir / "server.log"))
        classpath = os.pathsep.join(str(j) for j in jars)
        if fresh:
            self._java(classpath, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id()}", "-c",
                       str(self.base_dir / "server.properties"), check=True)
        out = files.open_private_log(self.base_dir / "broker.log")
        try:
            self.proc = subprocess.Popen(self._argv(classpath, "kafka.Kafka", str(self.base_dir / "server.properties")),
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            os.close(out)
        files.write_private(self.base_dir / "kafka.json", json.dumps({"port": self.port, "controller": self.controller,
                                                                      "pid": self.proc.pid}))
        self._wait(timeout)
        return self

    def _argv(self, classpath: str, main: str, *args: str) -> list[str]:
        return ["java", f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                f"-Dlog4j2.configurationFile={self.base_dir / 'log4j2.properties'}", "-cp", classpath, main, *args]

    def _java(self, classpath: str, main: str, *args: str, check: bool) -> subprocess.CompletedProcess[str]:
        run = subprocess.run(self._argv(classpath, main, *args), capture_output=True, text=True, timeout=300)
        if check and run.returncode:
            raise RuntimeError(f"{main} {' '.join(args[:1])} failed: {(run.stdout + run.stderr)[-2000:]}")
        return run

    def _wait(self, timeout: float) -> None:
        """Until the broker answers a metadata request (it serves once the controller elected itself)."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        # QUIET: librdkafka logs each refused connection until the broker serves
        admin = AdminClient({**self.client_config(), "socket.timeout.ms": 2000}, logger=QUIET)
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited ({self.proc.returncode}): "
                                   f"{(self.base_dir / 'broker.log').read_text(errors='replace')[-3000:]}")
            try:
                admin.list_topics(timeout=2)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Kafka broker did not serve within {timeout:.0f} s (see "
                                       f"{self.base_dir / 'broker.log'})") from None
                time.sleep(0.5)



def admin(broker: KafkaBroker) -> Any:
    """An admin client of the broker (librdkafka's own logging kept quiet)."""
    from confluent_kafka.admin import AdminClient

    return AdminClient(broker.client_config(), logger=QUIET)


def add_partitions(broker: KafkaBroker, topic: str, total: int) -> None:
    from confluent_kafka.admin import NewPartitions

    client = admin(broker)
    client.create_partitions([NewPartitions(topic, total)])[topic].result(timeout=60)


def delete_records(broker: KafkaBroker, topic: str, before: dict[int, int]) -> None:
    """Remove every record of each partition below the given offset (what retention does)."""
    from confluent_kafka import TopicPartition

    client = admin(broker)
    found = client.delete_records([TopicPartition(topic, p, o) for p, o in before.items()],
                                         request_timeout=30)
    for future in found.values():
        future.result(timeout=60)


def read_topic(broker: KafkaBroker, topic: str, *, committed_only: bool = True) -> list[Any]:
    """Every record of the topic a reader of the given isolation sees, as consumer messages."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**broker.client_config(), "group.id": uuid.uuid4().hex, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "enable.partition.eof": True,
                         "isolation.level": "read_committed" if committed_only else "read_uncommitted"},
                        logger=QUIET)
    md = consumer.list_topics(topic, timeout=30).topics[topic]
    consumer.assign([TopicPartition(topic, p, -2) for p in md.partitions])
    done: set[int] = set()
    out = []
    while len(done) < len(md.partitions):
        msg = consumer.poll(10)
        if msg is None:
            break
        error = msg.error()
        if error is not None:
            if error.name() == "_PARTITION_EOF":
                done.add(int(msg.partition() or 0))
            continue
        out.append(msg)
    consumer.close()
    return out


if __name__ == "__main__":  # python -m dev.kafka fetch: the broker's jars, once per machine
    import sys

    if sys.argv[1:] != ["fetch"]:
        raise SystemExit("usage: python -m dev.kafka fetch")
    print(f"Kafka {KAFKA_VERSION}: {len(BROKER.fetch())} jars in {BROKER.directory}")
