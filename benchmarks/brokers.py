"""The brokers under test: Apache Kafka (KRaft, from the jars or Docker) and Fluvial, each in a temp dir on loopback."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO
from collections.abc import Callable, Sequence

import psutil

from benchmarks import kafka_dist


class BrokerStartError(RuntimeError):
    """A broker did not start or did not answer in time."""


class KafkaFrom(str, Enum):
    JARS = "jars"
    DOCKER = "docker"


@dataclass(frozen=True)
class SystemSpec:
    """One system under test, as named in the results."""

    name: str           # key in results, e.g. "kafka", "fluvial", "fluvial-flush-none"
    product: str        # "kafka" or "fluvial"
    label: str          # human-readable, with the durability setting
    durability: str     # what an acknowledged acks=all produce means on this system
    flush_policy: str | None = None  # Fluvial --flush-policy; None = the broker's own default


KAFKA = SystemSpec(
    name="kafka",
    product="kafka",
    label=f"Apache Kafka {kafka_dist.KAFKA_VERSION}",
    durability="acks=all acknowledged once in the page cache; no fsync per write (Kafka's default "
               "log.flush.interval.messages/ms unset, the OS flushes)",
)
FLUVIAL_DEFAULT = SystemSpec(
    name="fluvial",
    product="fluvial",
    label="Fluvial (default: flush-policy ack)",
    durability="acks=all acknowledged only after fsync (Fluvial's default --flush-policy ack)",
    flush_policy=None,
)
FLUVIAL_FLUSH_NONE = SystemSpec(
    name="fluvial-flush-none",
    product="fluvial",
    label="Fluvial (flush-policy none, as Kafka)",
    durability="acks=all acknowledged once written to the OS; no fsync per write (--flush-policy none, "
               "the same as Kafka's default)",
    flush_policy="none",
)
ALL_SYSTEMS = (KAFKA, FLUVIAL_DEFAULT, FLUVIAL_FLUSH_NONE)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(bootstrap: str, timeout_s: float, alive: Callable[[], bool],
                       client_config: dict[str, object] | None = None) -> None:
    """Block until a Kafka client gets metadata from `bootstrap` (or raise); `client_config`
    adds the client's security settings for a TLS or SASL listener."""
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if not alive():
            raise BrokerStartError(f"broker process at {bootstrap} exited during start-up")
        if _port_open(bootstrap):
            admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **(client_config or {})})
            try:
                md = admin.list_topics(timeout=2)
                if md.brokers:
                    return
            except Exception as exc:  # a half-started broker answers with all kinds of errors
                last_error = exc
        time.sleep(0.2)
    raise BrokerStartError(f"broker at {bootstrap} not serving after {timeout_s:.0f}s ({last_error})")


def responsive(bootstrap: str, timeout_s: float = 5.0) -> bool:
    """Whether the broker still answers a metadata request."""
    from confluent_kafka.admin import AdminClient

    try:
        return bool(AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=timeout_s).brokers)
    except Exception:
        return False


def _port_open(bootstrap: str) -> bool:
    host, port = bootstrap.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


class RssSampler:
    """Samples the resident set of a process tree in a thread and keeps the peak."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        self._pid = pid
        self._interval_s = interval_s
        self._peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    def _sample(self) -> int:
        try:
            proc = psutil.Process(self._pid)
            total = proc.memory_info().rss
            for child in proc.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:
                    pass
            return total
        except psutil.Error:
            return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self._sample())
            self._stop.wait(self._interval_s)

    def __enter__(self) -> "RssSampler":
        self._peak = self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self._sample())

    @property
    def peak_bytes(self) -> int:
        return self._peak


@dataclass
class RunningBroker:
    """Common shape of a started broker: where clients connect and which process to watch."""

    spec: SystemSpec
    bootstrap: str
    pid: int
    workdir: Path
    log_path: Path
    version: str
    # Fluvial's other listeners by option name, e.g. {"--http-port": 8081, "--flight-port": 8815}.
    listeners: dict[str, int] = field(default_factory=dict)
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)
    _container: object | None = field(default=None, repr=False)

    @property
    def http_url(self) -> str:
        """Fluvial's schema registry."""
        return f"http://{self.bootstrap.rsplit(':', 1)[0]}:{self.listeners['--http-port']}"

    @property
    def flight_url(self) -> str:
        """Fluvial's table API (Arrow Flight), for the native client."""
        return f"grpc://{self.bootstrap.rsplit(':', 1)[0]}:{self.listeners['--flight-port']}"

    def alive(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return psutil.pid_exists(self.pid)

    def log_tail(self, n_bytes: int = 3000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-n_bytes:].decode(errors="replace")

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._container is not None:
            try:
                self._container.stop()
            finally:
                self._container = None
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


# --- Apache Kafka from the jars -------------------------------------------------------------------

# What Kafka's own kafka-server-start.sh / kafka-run-class.sh pass to the JVM.
KAFKA_JVM_OPTS = (
    "-Xmx1G", "-Xms1G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true",
)


def kraft_server_properties(log_dir: Path, port: int, controller_port: int) -> str:
    """A single-node combined broker/controller, otherwise the stock config/server.properties:
    in particular no log.flush.* settings, so durability is the page cache, as Kafka ships.

    One setting differs from Kafka's defaults and none of its measured paths: a deleted
    topic's files are removed at once (log.segment.delete.delay.ms=0, the broker's default
    for the topic setting file.delete.delay.ms, 60 s; the topic setting's own name is ignored
    in this file). With the delay,
    the files of a topic a case deleted were removed a minute later, in the middle of the
    next system's case, whose fsyncs then waited for that deletion's journal commit and
    discards."""
    return f"""\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
log.dirs={log_dir}
num.partitions=1
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.hours=168
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
log.segment.delete.delay.ms=0
"""


def random_cluster_id() -> str:
    """Kafka's Uuid text form: 16 random bytes, URL-safe base64 without padding, not starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def start_kafka_from_jars(workdir: Path, spec: SystemSpec = KAFKA, timeout_s: float = 90.0) -> RunningBroker:
    port, controller_port = free_port(), free_port()
    while controller_port == port:
        controller_port = free_port()
    log_dir = workdir / "kraft-logs"
    props = workdir / "server.properties"
    props.write_text(kraft_server_properties(log_dir, port, controller_port))
    log_path = workdir / "kafka.log"
    fmt = subprocess.run(
        kafka_dist.java_tool("kafka.tools.StorageTool", "format", "-t", random_cluster_id(),
                             "-c", str(props), log_level="WARN"),
        capture_output=True, text=True, timeout=120,
    )
    if fmt.returncode != 0:
        raise BrokerStartError(f"kafka-storage format failed: {fmt.stderr[-2000:]}{fmt.stdout[-2000:]}")
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        kafka_dist.java_tool("kafka.Kafka", str(props), jvm_opts=KAFKA_JVM_OPTS, log_level="INFO"),
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir,
    )
    broker = RunningBroker(spec=spec, bootstrap=f"127.0.0.1:{port}", pid=proc.pid, workdir=workdir,
                           log_path=log_path, version=kafka_dist.KAFKA_VERSION, _proc=proc, _log=log)
    try:
        wait_until_serving(broker.bootstrap, timeout_s, broker.alive)
    except BaseException:
        broker.stop()
        raise BrokerStartError(f"Apache Kafka did not start; log tail:\n{broker.log_tail()}")
    return broker


# --- Apache Kafka from Docker (testcontainers) ----------------------------------------------------

def docker_available() -> bool:
    try:
        import docker  # testcontainers' own dependency
        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def start_kafka_from_docker(workdir: Path, spec: SystemSpec = KAFKA, timeout_s: float = 180.0) -> RunningBroker:
    """The `apache/kafka` image of the pinned version, configured like the jar broker above.
    testcontainers' KafkaContainer targets Confluent's images, so a plain container is used."""
    from testcontainers.core.container import DockerContainer

    port = free_port()
    container = DockerContainer(f"apache/kafka:{kafka_dist.KAFKA_VERSION}")
    # The listener port is the same inside and outside, so the advertised address is right on both.
    host = container.get_docker_client().host()
    settings = {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": f"PLAINTEXT://:{port},CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{host}:{port}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_NUM_PARTITIONS": "1",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_LOG_SEGMENT_DELETE_DELAY_MS": "0",  # as kraft_server_properties says
    }
    for key, value in settings.items():
        container.with_env(key, value)
    container.with_bind_ports(port, port)
    container.start()
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    pid = int(wrapped.attrs["State"]["Pid"])  # the container's first process; RSS counts its children too
    log_path = workdir / "kafka-docker.log"
    broker = RunningBroker(spec=spec, bootstrap=f"{host}:{port}", pid=pid, workdir=workdir, log_path=log_path,
                           version=kafka_dist.KAFKA_VERSION, _container=container)
    try:
        wait_until_serving(broker.bootstrap, timeout_s, lambda: True)
    except BaseException:
        log_path.write_bytes(wrapped.logs())
        broker.stop()
        raise
    return broker


# --- Fluvial --------------------------------------------------------------------------------------

def fluvial_command() -> list[str]:
    return [sys.executable, "-m", "fluvial.broker.cli", "broker"]


def _fluvial_options() -> str:
    """The broker's --help text, to pass free ports for the listeners that exist in this build."""
    try:
        done = subprocess.run([*fluvial_command(), "--help"], capture_output=True, text=True, timeout=60)
        return done.stdout + done.stderr
    except (OSError, subprocess.TimeoutExpired):
        return ""


def start_fluvial(workdir: Path, spec: SystemSpec, timeout_s: float = 60.0, extra_args: Sequence[str] = (),
                  client_config: dict[str, object] | None = None,
                  command: Sequence[str] | None = None) -> RunningBroker:
    """`extra_args` go to `fluvial broker` as they are (e.g. security settings); `client_config`
    is what a client needs to reach the Kafka listener they configure; `command` replaces
    `fluvial broker` (a broker with probes, benchmarks/e2e_trace.py)."""
    port = free_port()
    data_dir = workdir / "data"
    cmd = [*(fluvial_command() if command is None else command), "--data-dir", str(data_dir), "--host", "127.0.0.1", "--kafka-port", str(port)]
    if spec.flush_policy is not None:
        cmd += ["--flush-policy", spec.flush_policy]
    # Several brokers run side by side: every other listener must get its own free port too.
    options = _fluvial_options()
    listeners = {flag: free_port() for flag in ("--flight-port", "--http-port") if flag in options}
    for flag, listener_port in listeners.items():
        cmd += [flag, str(listener_port)]
    cmd += list(extra_args)
    # Diagnostics: more broker options from the environment (e.g. --event-loop asyncio for an A/B run).
    cmd += os.environ.get("FLUVIAL_BENCH_BROKER_ARGS", "").split()
    log_path = workdir / "fluvial.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
    broker = RunningBroker(spec=spec, bootstrap=f"127.0.0.1:{port}", pid=proc.pid, workdir=workdir,
                           log_path=log_path, version=_fluvial_version(), listeners=listeners, _proc=proc,
                           _log=log)
    try:
        wait_until_serving(broker.bootstrap, timeout_s, broker.alive, client_config)
    except BaseException:
        broker.stop()
        raise BrokerStartError(f"Fluvial ({spec.name}) did not start: {' '.join(cmd)}\nlog tail:\n"
                               f"{broker.log_tail()}")
    return broker


def _fluvial_version() -> str:
    try:
        from importlib.metadata import version
        return version("fluvial")
    except Exception:
        return "unknown"


def start_system(spec: SystemSpec, workdir: Path, kafka_from: KafkaFrom = KafkaFrom.JARS) -> RunningBroker:
    workdir.mkdir(parents=True, exist_ok=True)
    if spec.product == "kafka":
        if kafka_from is KafkaFrom.DOCKER:
            return start_kafka_from_docker(workdir, spec)
        return start_kafka_from_jars(workdir, spec)
    return start_fluvial(workdir, spec)


def make_workdir(prefix: str = "fluvial-bench-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def remove_workdir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
