"""A single-node KRaft broker of Apache Kafka on loopback, for the Kafka tests and
``bench/kafka_latency.py`` (one implementation: ``tests/kafka/kafka_testing.py`` imports it).

``tools/fetch_kafka.sh`` (run by ``make test`` and ``.ci/run``) resolves the broker
(``org.apache.kafka:kafka_2.13``) and Spark's Kafka connector into the local Maven
repository and writes their classpaths under ``build/kafka/``. The broker runs as
``java -cp <broker classpath> kafka.Kafka server.properties`` after ``kafka.tools.StorageTool
format`` with a fresh cluster id, on free loopback ports, in its own temporary
directory, with a small heap. :func:`broker_problem` says what is missing to start one.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
START_TIMEOUT_S = 90.0
ROOT = Path(__file__).resolve().parents[1]
KAFKA_DIR = Path(os.environ.get("LOCKGATE_KAFKA_DIR", ROOT / "build" / "kafka"))
BROKER_CLASSPATH = KAFKA_DIR / "broker.classpath"
CONNECTOR_CLASSPATH = KAFKA_DIR / "spark-connector.classpath"


def read_classpath(path: Path) -> str | None:
    """The classpath in ``path`` when every jar it names exists, else None."""
    if not path.is_file():
        return None
    text = path.read_text().strip()
    jars = [j for j in text.split(":") if j]
    if not jars or not all(Path(j).is_file() for j in jars):
        return None
    return text


def broker_problem() -> str | None:
    """What keeps a broker from starting here (java, the broker's jars, confluent-kafka),
    or None."""
    if shutil.which("java") is None:
        return "java is not on PATH"
    if read_classpath(BROKER_CLASSPATH) is None:
        return (
            f"{BROKER_CLASSPATH} is missing or names missing jars: run tools/fetch_kafka.sh "
            "(needs mvn; make test runs it)"
        )
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return "confluent-kafka is not installed: pip install -e '.[kafka]'"
    return None


def connector_jars() -> str | None:
    """Spark's Kafka connector and its dependencies as a ``spark.jars`` value, or None
    when ``build/kafka/spark-connector.classpath`` is missing or names missing jars."""
    classpath = read_classpath(CONNECTOR_CLASSPATH)
    return None if classpath is None else ",".join(j for j in classpath.split(":") if j)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def random_cluster_id() -> str:
    """A KRaft cluster id: a random UUID in Kafka's URL-safe base64 without padding, not
    starting with "-" (as Kafka's ``Uuid.randomUuid``: the storage tool would take it
    for an option)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaBroker:
    """One combined broker+controller KRaft node on two free loopback ports."""

    def __init__(self, classpath: str, directory: Path, *, heap: str = "512m") -> None:
        self.classpath = classpath
        self.directory = directory
        self.heap = heap
        self.port = free_port()
        self.controller_port = free_port()
        self.cluster_id = random_cluster_id()
        self.proc: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / "server.properties"
        self.config.write_text(self._properties())
        self._formatted = False

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def _properties(self) -> str:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.directory / "data"),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "2",
            # Records are kept whatever their timestamps; tests that need data gone delete
            # it (delete_records) or set retention on their topic.
            "log.retention.ms": "-1",
            "log.retention.check.interval.ms": "1000",
            "log.segment.delete.delay.ms": "0",
            "log.initial.task.delay.ms": "0",
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            "java",
            f"-Xmx{self.heap}",
            "-Xms64m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            "-cp",
            self.classpath,
            main,
            *args,
        ]

    def start(self) -> None:
        if not self._formatted:
            result = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    self.cluster_id,
                    "-c",
                    str(self.config),
                    "--ignore-formatted",
                ),
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise RuntimeError(
                    f"kafka-storage format failed:\n{result.stdout}\n{result.stderr}"
                )
            self._formatted = True
        log = open(self.directory / "broker.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            self._java("kafka.Kafka", str(self.config)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + START_TIMEOUT_S
        last_error: Exception | None = None
        while True:
            assert self.proc is not None
            if self.proc.poll() is None and not self._port_open():
                if time.monotonic() > deadline:
                    self.stop(kill=True)
                    raise RuntimeError(
                        f"the Kafka broker did not open {self.bootstrap} in "
                        f"{START_TIMEOUT_S}s; log:\n" + self.log()[-4000:]
                    )
                time.sleep(0.2)
                continue
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited at start; log:\n{self.log()[-4000:]}")
            try:
                admin = AdminClient({"bootstrap.servers": self.bootstrap})
                metadata = admin.list_topics(timeout=2)
                if metadata.brokers:
                    return
            except Exception as exc:  # noqa: BLE001 - not up yet
                last_error = exc
            if time.monotonic() > deadline:
                self.stop(kill=True)
                raise RuntimeError(
                    f"the Kafka broker did not come up in {START_TIMEOUT_S}s ({last_error}); log:\n"
                    + self.log()[-4000:]
                )
            time.sleep(0.2)

    def _port_open(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(1)
            return s.connect_ex((HOST, self.port)) == 0

    def log(self) -> str:
        path = self.directory / "broker.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, *, kill: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # -- conveniences for the tests -----------------------------------------------------
    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int = 1, **config: str) -> None:
        from confluent_kafka.admin import NewTopic

        admin = self.admin()  # kept alive until the futures resolve
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)]
        )
        futures[name].result(30)
        self._wait_for_leaders(name, partitions)

    def add_partitions(self, name: str, total: int) -> None:
        from confluent_kafka.admin import NewPartitions

        admin = self.admin()
        admin.create_partitions([NewPartitions(name, total)])[name].result(30)
        self._wait_for_leaders(name, total)

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """Delete the records of ``topic``-``partition`` below offset ``before``, as
        retention would."""
        from confluent_kafka import TopicPartition

        admin = self.admin()
        futures = admin.delete_records([TopicPartition(topic, partition, before)])
        for future in futures.values():
            future.result(30)

    def _wait_for_leaders(self, name: str, partitions: int) -> None:
        deadline = time.monotonic() + 30
        admin = self.admin()
        while time.monotonic() < deadline:
            topic = admin.list_topics(name, timeout=5).topics.get(name)
            if (
                topic is not None
                and topic.error is None
                and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values())
            ):
                return
            time.sleep(0.05)
        raise RuntimeError(f"topic {name} has no leaders for its {partitions} partitions")

    def produce(
        self,
        topic: str,
        records: list[dict[str, Any]],
    ) -> None:
        """Each record: value, and optionally key, partition, timestamp (ms), headers."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0})
        errors: list[Any] = []

        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        for r in records:
            kwargs: dict[str, Any] = {"value": r.get("value"), "key": r.get("key")}
            if "partition" in r:
                kwargs["partition"] = r["partition"]
            if "timestamp" in r:
                kwargs["timestamp"] = r["timestamp"]
            if "headers" in r:
                kwargs["headers"] = r["headers"]
            producer.produce(topic, on_delivery=report, **kwargs)
        remaining = producer.flush(30)
        assert remaining == 0 and not errors, (remaining, errors)
