"""A mutation fuzzer over the Kafka listener, fed with requests of real clients.

`record` runs real clients (confluent-kafka, kafka-python, aiokafka, Apache Kafka's Java
tools) against a broker
through a recording proxy and writes the request frames they sent: the corpus (a file of
Kafka frames, each with its size prefix). `fuzz` sends mutations of those frames (bit
flips, integer and varint lies, truncation, wrong versions, splices, frames cut short) over
several connections to a broker process while a probe client keeps asking it for its API
versions, and reports requests/s, the outcomes, the probe's slowest round trip and the
broker's memory. What counts as a failure: a traceback or an internal error in the
broker's log, a probe that stops getting answers, memory that keeps growing.

    python -m benchmarks.kafka_fuzz record tests/fixtures/kafka_requests.bin
    python -m benchmarks.kafka_fuzz soak --seconds 600       # saves benchmarks/results/kafka_fuzz.json

The proxy listens on 127.0.0.2 at the broker's port and the broker advertises 127.0.0.2,
so clients reach every broker connection through it (all of 127/8 is loopback on Linux).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "kafka_requests.bin"
RESULTS = ROOT / "benchmarks" / "results"
_SIZE = struct.Struct(">i")
PROXY_HOST = "127.0.0.2"
# Topics the recorded requests name; the fuzzed broker has them, so mutations reach tables.
TOPICS = {"fz-raw": 3, "fz-keyed": 2, "fz-grow": 1}
GROUP = "fz-group"
# Lines of the broker's log that mean a handler or the listener failed on its own.
FAILURE = re.compile(r"Traceback|internal error|Unhandled exception| ERROR ")


# -- corpus ---------------------------------------------------------------------------------

def read_frames(data: bytes) -> list[bytes]:
    """Split a file of size-prefixed Kafka frames into frame bodies (without the size)."""
    frames, pos = [], 0
    while pos + 4 <= len(data):
        (size,) = _SIZE.unpack_from(data, pos)
        frames.append(data[pos + 4:pos + 4 + size])
        pos += 4 + size
    return frames


def write_frames(path: Path, frames: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(_SIZE.pack(len(f)) + f for f in frames))


class RecordingProxy:
    """Forwards connections from PROXY_HOST:port to the broker, keeping each request frame."""

    def __init__(self, broker_port: int, max_frame: int = 32 * 1024):
        self.broker_port = broker_port
        self.max_frame = max_frame
        self.frames: list[bytes] = []
        self._lock = threading.Lock()
        self._server = socket.create_server((PROXY_HOST, broker_port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.broker_port))
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _requests(self, src: socket.socket, dst: socket.socket) -> None:
        buf = b""
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
                buf += chunk
                while len(buf) >= 4 and len(buf) >= 4 + _SIZE.unpack_from(buf)[0]:
                    size = _SIZE.unpack_from(buf)[0]
                    if size <= self.max_frame:
                        with self._lock:
                            self.frames.append(buf[4:4 + size])
                    buf = buf[4 + size:]
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass

    def close(self) -> None:
        self._server.close()


def _client_sessions(bootstrap: str) -> None:
    """What the corpus is made of: each client library doing ordinary things."""
    import asyncio

    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, n, 1, config={"retention.ms": "3600000"})
                                  for t, n in TOPICS.items()]).values():
        f.result(15)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                         "compression.type": "lz4"})
    for i in range(30):
        producer.produce("fz-keyed", key=f"k{i % 7}".encode(), value=f"value-{i}".encode(), headers=[("h", b"1")])
        producer.produce("fz-raw", value=os.urandom(40))
    producer.flush(15)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe(["fz-keyed"])
    got, deadline = 0, time.time() + 20
    while got < 20 and time.time() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got += 1
    consumer.commit(asynchronous=False)
    consumer.get_watermark_offsets(TopicPartition("fz-keyed", 0), timeout=10)
    consumer.offsets_for_times([TopicPartition("fz-keyed", 0, 1)], timeout=10)
    consumer.close()
    for f in admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "fz-raw")]).values():
        f.result(10)
    for f in admin.create_topics([NewTopic("fz-temporary", 1, 1)]).values():
        f.result(15)
    for f in admin.delete_topics(["fz-temporary"]).values():
        f.result(15)
    admin.create_partitions([NewPartitions("fz-grow", 2)])["fz-grow"].result(10)
    admin.list_consumer_groups().result(10)
    admin.describe_consumer_groups([GROUP])[GROUP].result(10)

    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType
    from kafka.admin import NewPartitions as KNewPartitions
    from kafka.admin import NewTopic as KNewTopic
    from kafka.structs import TopicPartition as KTopicPartition

    kp = KafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="gzip")
    for i in range(20):
        kp.send("fz-raw", key=b"kp", value=f"kp-{i}".encode())
    kp.flush(15)
    kp.close()
    kc = KafkaConsumer("fz-raw", bootstrap_servers=bootstrap, group_id=GROUP + "-kp", auto_offset_reset="earliest",
                       consumer_timeout_ms=3000)
    for _ in kc:
        pass
    kc.commit()
    kc.close()
    ka = KafkaAdminClient(bootstrap_servers=bootstrap)
    calls: list[tuple[Callable, tuple]] = [
        (ka.create_topics, ([KNewTopic("fz-kp-temp", 2, 1)],)),
        (ka.delete_topics, (["fz-kp-temp"],)),
        (ka.describe_configs, ([KConfigResource(ConfigResourceType.TOPIC, "fz-keyed")],)),
        (ka.alter_configs, ([KConfigResource(ConfigResourceType.TOPIC, "fz-keyed",
                                             configs={"retention.ms": "7200000"})],)),
        (ka.create_partitions, ({"fz-grow": KNewPartitions(3)},)),
        (ka.list_groups, ()), (ka.describe_groups, ([GROUP + "-kp"],)),
        (ka.list_group_offsets, (GROUP + "-kp",)),
        (ka.delete_records, ({KTopicPartition("fz-raw", 0): 1},)),
        (ka.describe_log_dirs, ()), (ka.describe_cluster, ()), (ka.describe_topics, (["fz-raw"],)),
        (ka.describe_topic_partitions, (["fz-raw"],)), (ka.describe_producers, ([KTopicPartition("fz-keyed", 0)],)),
        (ka.list_partition_offsets, ({KTopicPartition("fz-raw", 0): -1},)),
        (ka.delete_group_offsets, (GROUP + "-kp", [KTopicPartition("fz-raw", 0)])),
        (ka.delete_groups, ([GROUP + "-kp"],)),
    ]
    for fn, args in calls:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - the request was sent, which is what the corpus needs
            pass
    ka.close()

    async def with_aiokafka() -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        ap = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await ap.start()
        for i in range(10):
            await ap.send_and_wait("fz-keyed", key=b"a", value=f"aio-{i}".encode())
        await ap.stop()
        ac = AIOKafkaConsumer("fz-keyed", bootstrap_servers=bootstrap, group_id=GROUP + "-aio",
                              auto_offset_reset="earliest")
        await ac.start()
        await ac.getmany(timeout_ms=3000)
        await ac.commit()
        await ac.stop()

    asyncio.run(with_aiokafka())


def _java_sessions(bootstrap: str) -> None:
    """Apache Kafka's own tools (when `python -m benchmarks.kafka_dist fetch` has run): the
    Java admin client's and console clients' requests (DescribeTopicPartitions, ListGroups
    with a states filter, the Java consumer's fetches and leader-epoch checks)."""
    import subprocess

    from benchmarks import kafka_dist

    if not kafka_dist.is_fetched():
        print("Apache Kafka's jars are not fetched: no Java requests in the corpus", file=sys.stderr)
        return
    server = ("--bootstrap-server", bootstrap)
    runs = [
        (("org.apache.kafka.tools.TopicCommand", *server, "--describe", "--topic", "fz-raw"), None),
        (("org.apache.kafka.tools.TopicCommand", *server, "--create", "--topic", "fz-java", "--partitions", "2"), None),
        (("org.apache.kafka.tools.ConsoleProducer", *server, "--topic", "fz-java", "--property", "parse.key=true"),
         b"k1\tv1\nk2\tv2\n"),
        (("org.apache.kafka.tools.consumer.ConsoleConsumer", *server, "--topic", "fz-java", "--group", GROUP + "-java",
          "--from-beginning", "--max-messages", "2", "--timeout-ms", "15000"), None),
        (("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", *server, "--list", "--state", "Empty"), None),
        (("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", *server, "--describe", "--group",
          GROUP + "-java"), None),
        (("org.apache.kafka.tools.TopicCommand", *server, "--delete", "--topic", "fz-java"), None),
    ]
    for args, stdin in runs:
        try:
            subprocess.run(kafka_dist.java_tool(*args), input=stdin, capture_output=True, timeout=90)
        except (subprocess.TimeoutExpired, OSError) as exc:
            print(f"{args[0]}: {exc}", file=sys.stderr)


def record(out: Path, per_kind: int = 12) -> list[bytes]:
    """Run the client sessions through the proxy; keep up to `per_kind` distinct frames per
    (API key, version) and write them to `out`."""
    import tempfile

    sys.path.insert(0, str(ROOT))
    from tests.support.broker_process import BrokerProcess

    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data", "--advertised-host", PROXY_HOST, "--log-format", "text").start()
        proxy = RecordingProxy(broker.port)
        try:
            _client_sessions(f"{PROXY_HOST}:{broker.port}")
            _java_sessions(f"{PROXY_HOST}:{broker.port}")
        finally:
            proxy.close()
            broker.stop()
    kept: list[bytes] = []
    seen: set[bytes] = set()
    per: Counter = Counter()
    for frame in proxy.frames:
        if len(frame) < 8:
            continue
        key = frame[:4]
        body = frame[8:]  # without the correlation id: repeats of one request are one entry
        if body in seen or per[key] >= per_kind:
            continue
        seen.add(body)
        per[key] += 1
        kept.append(frame)
    write_frames(out, kept)
    return kept


# -- mutations ------------------------------------------------------------------------------

_INTS32 = [0, -1, 1, 0x7FFFFFFF, -0x80000000, 1 << 20, 1 << 30, 65535]
_INTS16 = [0, -1, 0x7FFF, -0x8000, 1, 255]


def _flip_bits(rng: random.Random, f: bytearray) -> str:
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(8, len(f)) if len(f) > 8 else rng.randrange(len(f))
        f[i] ^= 1 << rng.randrange(8)
    return "bit flips"


def _int_lie(rng: random.Random, f: bytearray) -> str:
    if len(f) < 14:
        return _flip_bits(rng, f)
    i = rng.randrange(10, len(f) - 4)
    if rng.random() < 0.5:
        f[i:i + 4] = struct.pack(">i", rng.choice(_INTS32))
        return "int32 lie"
    f[i:i + 2] = struct.pack(">h", rng.choice(_INTS16))
    return "int16 lie"


def _varint_lie(rng: random.Random, f: bytearray) -> str:
    i = rng.randrange(10, len(f)) if len(f) > 10 else len(f)
    f[i:i] = rng.choice([b"\xff" * 9 + b"\x7f", b"\xff\xff\xff\xff\x0f", b"\x00", b"\x80\x80\x80\x80\x80"])
    return "varint lie"


def _truncate(rng: random.Random, f: bytearray) -> str:
    del f[rng.randrange(8, len(f)) if len(f) > 8 else 0:]
    return "truncation"


def _wrong_version(rng: random.Random, f: bytearray) -> str:
    f[2:4] = struct.pack(">h", rng.choice([rng.randrange(0, 18), -1, 0x7FFF]))
    return "wrong version"


def _splice(rng: random.Random, f: bytearray, other: bytes) -> str:
    if len(other) > 10 and len(f) > 10:
        a, b = sorted(rng.sample(range(10, len(other)), 2)) if len(other) > 11 else (10, len(other))
        i = rng.randrange(10, len(f))
        f[i:i + (b - a)] = other[a:b]
    return "splice"


def mutate(rng: random.Random, frame: bytes, corpus: list[bytes]) -> tuple[bytes, str, bool]:
    """A mutated frame, the mutation's name, and whether to cut the connection after sending
    only part of it (a frame whose size prefix promises more than arrives)."""
    f = bytearray(frame)
    r = rng.random()
    if r < 0.30:
        kind = _flip_bits(rng, f)
    elif r < 0.50:
        kind = _int_lie(rng, f)
    elif r < 0.60:
        kind = _varint_lie(rng, f)
    elif r < 0.72:
        kind = _truncate(rng, f)
    elif r < 0.84:
        kind = _wrong_version(rng, f)
    elif r < 0.94:
        kind = _splice(rng, f, rng.choice(corpus))
    else:
        return _SIZE.pack(len(f) + rng.randint(1, 1000)) + bytes(f), "frame cut short", True
    if rng.random() < 0.2:  # several mutations at once now and then
        kind += "+" + _flip_bits(rng, f)
    return _SIZE.pack(len(f)) + bytes(f), kind, False


# -- running --------------------------------------------------------------------------------

@dataclass
class FuzzReport:
    seconds: float
    requests: int
    requests_per_s: float
    outcomes: dict[str, int]
    mutations: dict[str, int]
    probe_samples: int
    probe_max_ms: float
    probe_p99_ms: float
    rss_start_mb: float
    rss_end_mb: float
    rss_peak_mb: float
    failures: list[str] = field(default_factory=list)
    # RSS at each tenth of the run: growth that stops (caches filling) or keeps on (a leak).
    rss_tenths_mb: list[float] = field(default_factory=list)


class _Worker(threading.Thread):
    def __init__(self, address: tuple[str, int], corpus: list[bytes], seed: int, deadline: float,
                 reply_timeout_s: float):
        super().__init__(daemon=True)
        self.address, self.corpus, self.rng = address, corpus, random.Random(seed)
        self.deadline, self.reply_timeout_s = deadline, reply_timeout_s
        self.outcomes: Counter = Counter()
        self.mutations: Counter = Counter()
        self.sent = 0

    def run(self) -> None:
        sock = None
        while time.monotonic() < self.deadline:
            if sock is None:
                sock = socket.create_connection(self.address, timeout=10)
                sock.settimeout(self.reply_timeout_s)
            frame, kind, cut = mutate(self.rng, self.rng.choice(self.corpus), self.corpus)
            self.mutations[kind.split("+")[0]] += 1
            self.sent += 1
            try:
                sock.sendall(frame[:max(4, len(frame) - 1)] if cut else frame)
                if cut:
                    raise ConnectionAbortedError
                head = _recv(sock, 4)
                _recv(sock, _SIZE.unpack(head)[0])
                self.outcomes["answered"] += 1
                continue
            except ConnectionAbortedError:
                self.outcomes["cut short"] += 1
            except socket.timeout:
                self.outcomes["no answer in time"] += 1  # e.g. a long poll, a join waiting for members
            except (ConnectionError, OSError):
                self.outcomes["closed by broker"] += 1
            sock.close()
            sock = None
        if sock is not None:
            sock.close()


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionResetError("closed")
        buf += chunk
    return buf


def _restore_topics(bootstrap: str) -> None:
    """Fuzzed CreateTopics and DeleteTopics change the topic set: back to TOPICS."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=10).topics
    # Grown by a fuzzed CreatePartitions (up to 10,000 buckets): recreated at its size, so
    # that memory measures the broker, not the tables the fuzzer made it create.
    grown = [t for t, n in TOPICS.items() if t in metadata and len(metadata[t].partitions) != n]
    present = set(metadata) - set(grown)
    extra = [t for t in metadata if (t not in TOPICS or t in grown) and not t.startswith("__")]
    if extra:
        for f in admin.delete_topics(extra).values():
            try:
                f.result(30)
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass
    missing = [NewTopic(t, n, 1) for t, n in TOPICS.items() if t not in present]
    if missing:
        for f in admin.create_topics(missing).values():
            try:
                f.result(30)
            except Exception:  # noqa: BLE001 - created meanwhile
                pass


def fuzz(broker, corpus: list[bytes], seconds: float, workers: int = 3, seed: int = 1,
         reply_timeout_s: float = 0.5, tidy_every_s: float = 5.0) -> FuzzReport:
    """Fuzz a running `BrokerProcess` (tests/support/broker_process.py) for `seconds`."""
    import psutil

    from benchmarks.loop_probe import ResponsivenessProbe

    _restore_topics(broker.bootstrap)
    process = psutil.Process(broker.proc.pid)
    log_start = broker.log_path.stat().st_size
    rss = [process.memory_info().rss]
    started = time.monotonic()
    deadline = started + seconds
    threads = [_Worker(("127.0.0.1", broker.port), corpus, seed * 1000 + i, deadline, reply_timeout_s)
               for i in range(workers)]
    probe = ResponsivenessProbe(broker.bootstrap, interval_s=0.05)
    probe.start()
    for t in threads:
        t.start()
    next_tidy = started + tidy_every_s
    while any(t.is_alive() for t in threads):
        time.sleep(0.5)
        rss.append(process.memory_info().rss)
        if time.monotonic() > next_tidy:
            _restore_topics(broker.bootstrap)
            next_tidy = time.monotonic() + tidy_every_s
    elapsed = time.monotonic() - started
    probe_report = probe.stop()
    _restore_topics(broker.bootstrap)
    rss.append(process.memory_info().rss)
    outcomes: Counter = Counter()
    mutations: Counter = Counter()
    for t in threads:
        outcomes.update(t.outcomes)
        mutations.update(t.mutations)
    total = sum(t.sent for t in threads)
    log = broker.log_path.read_bytes()[log_start:].decode(errors="replace")
    failures = [line for line in log.splitlines() if FAILURE.search(line)][:20]
    mb = 1 / (1 << 20)
    return FuzzReport(round(elapsed, 2), total, round(total / elapsed, 1), dict(outcomes), dict(mutations),
                      probe_report.samples, round(probe_report.max_ms, 1), round(probe_report.p99_ms, 1),
                      round(rss[1 if len(rss) > 2 else 0] * mb, 1), round(rss[-1] * mb, 1), round(max(rss) * mb, 1),
                      failures, [round(rss[min(len(rss) - 1, len(rss) * i // 10)] * mb, 1) for i in range(1, 11)])


# -- registry and table API -----------------------------------------------------------------

def fuzz_registry(base_url: str, seconds: float, seed: int = 2) -> dict[str, int]:
    """Random methods, paths and bodies (mutated schemas) at the registry: status counts.
    A 5xx is a failure."""
    import urllib.error
    import urllib.request

    rng = random.Random(seed)
    avro = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})
    paths = ["/subjects/{s}/versions", "/subjects/{s}", "/subjects/{s}/versions/{v}", "/schemas/ids/{v}",
             "/compatibility/subjects/{s}/versions/{v}", "/config/{s}", "/subjects", "/schemas/ids/{v}/versions"]
    subjects = ["fz-value", "", "%00", "a" * 300, "..", "fz%2Fx", "%C3%BCn%C3%AF", "%FF%FE"]
    versions = ["1", "latest", "-1", "0", "18446744073709551616", "x", "2147483648"]
    statuses: Counter = Counter()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        path = rng.choice(paths).format(s=rng.choice(subjects), v=rng.choice(versions))
        method = rng.choice(["GET", "POST", "PUT", "DELETE"])
        body = bytearray(json.dumps(rng.choice([{"schema": avro}, {"schema": avro, "schemaType": "JSON"},
                                                 {"compatibility": "FULL"}, {"schema": 5}, [], "x"])).encode())
        for _ in range(rng.randint(0, 3)):
            if body:
                body[rng.randrange(len(body))] = rng.randrange(256)
        req = urllib.request.Request(base_url + path, data=bytes(body) if method in ("POST", "PUT") else None,
                                     method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                statuses[r.status] += 1
        except urllib.error.HTTPError as e:
            statuses[e.code] += 1
    return dict(statuses)


def fuzz_flight(location: str, seconds: float, seed: int = 3) -> dict[str, int]:
    """Random actions, tickets and descriptors at the table API: outcome counts. An error
    saying "internal error" is a failure."""
    import pyarrow as pa
    import pyarrow.flight as flight

    rng = random.Random(seed)
    client = flight.FlightClient(location)
    actions = [a.type for a in client.list_actions()]
    outcomes: Counter = Counter()
    deadline = time.monotonic() + seconds
    samples = [b"{}", json.dumps({"table": "fz-raw", "bucket": 0}).encode(),
               json.dumps({"table": "fz-raw", "columns": ["value"], "start": "earliest"}).encode()]

    def garble(data: bytes) -> bytes:
        out = bytearray(data)
        for _ in range(rng.randint(0, 4)):
            if out:
                out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out) if rng.random() < 0.8 else os.urandom(rng.randint(0, 40))

    while time.monotonic() < deadline:
        r = rng.random()
        try:
            if r < 0.5:
                kind = rng.choice(actions) if rng.random() < 0.9 else "x" * rng.randint(0, 5)
                if kind in ("drop-table", "create-table"):
                    kind = "describe"  # the fuzzed broker keeps its tables
                list(client.do_action(flight.Action(kind, garble(rng.choice(samples)))))
            elif r < 0.8:
                client.do_get(flight.Ticket(garble(rng.choice(samples)))).read_all()
            else:
                client.get_schema(flight.FlightDescriptor.for_command(garble(rng.choice(samples))))
            outcomes["answered"] += 1
        except pa.ArrowException as exc:
            outcomes["internal error" if "internal error" in str(exc) else "refused"] += 1
    client.close()
    return dict(outcomes)


# -- command line ---------------------------------------------------------------------------

# CreateTopics, DeleteTopics, CreatePartitions: fuzzed, they make the broker create and drop
# tables of up to 10,000 buckets every few seconds, which moves its memory for that reason.
TABLE_SHAPING_APIS = (19, 20, 37)


def _soak(seconds: float, workers: int, out: Path) -> dict:
    import tempfile

    sys.path.insert(0, str(ROOT))
    from benchmarks import machine
    from tests.support.broker_process import BrokerProcess

    corpus = read_frames(CORPUS.read_bytes())
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data", "--log-format", "text").start()
        try:
            report = fuzz(broker, corpus, seconds, workers=workers)
            # Memory without the churn of tables: a phase whose corpus leaves those APIs out.
            steady = fuzz(broker, [f for f in corpus if struct.unpack(">h", f[:2])[0] not in TABLE_SHAPING_APIS],
                          max(60.0, seconds / 5), workers=workers, seed=7)
            registry = fuzz_registry(broker.http_url, min(30.0, seconds / 10))
            table_api = fuzz_flight(broker.flight_url, min(30.0, seconds / 10))
        finally:
            broker.stop()
    result = {"kafka": asdict(report), "kafka_without_table_churn": asdict(steady), "registry_statuses": registry, "table_api": table_api,
              "corpus_frames": len(corpus), "workers": workers, "loadavg": os.getloadavg(),
              "machine": machine.describe()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kafka_fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record the corpus from real clients")
    rec.add_argument("out", type=Path, nargs="?", default=CORPUS)
    soak = sub.add_parser("soak", help="fuzz a broker for a while and save the figures")
    soak.add_argument("--seconds", type=float, default=600)
    soak.add_argument("--workers", type=int, default=3)
    soak.add_argument("--out", type=Path, default=RESULTS / "kafka_fuzz.json")
    args = parser.parse_args(argv)
    if args.command == "record":
        frames = record(args.out)
        kinds = Counter(struct.unpack(">h", f[:2])[0] for f in frames)
        print(f"{len(frames)} frames of {len(kinds)} API keys written to {args.out}")
        return
    result = _soak(args.seconds, args.workers, args.out)
    k = result["kafka"]
    print(f"{k['requests']} mutated requests in {k['seconds']} s: {k['requests_per_s']} requests/s; "
          f"outcomes {k['outcomes']}")
    print(f"probe: {k['probe_samples']} answers, slowest {k['probe_max_ms']} ms; "
          f"RSS {k['rss_start_mb']} -> {k['rss_end_mb']} MB (peak {k['rss_peak_mb']}); "
          f"load average {result['loadavg']}")
    s = result["kafka_without_table_churn"]
    print(f"without CreateTopics/DeleteTopics/CreatePartitions: {s['requests']} requests, RSS "
          f"{s['rss_start_mb']} -> {s['rss_end_mb']} MB, {len(s['failures'])} failure lines")
    print(f"registry statuses {result['registry_statuses']}; table API {result['table_api']}")
    print(f"failures: {len(k['failures'])}" + "".join(f"\n  {line}" for line in k["failures"] + s["failures"]))
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
