"""Power loss under a real broker: kill -9, take away every write the broker had not fsynced,
restart, and check what producers were told and what consumers saw.

Under flush policy `ack` every acknowledged acks=all record and every record a consumer
received is still there afterwards; under `none` the log is still a consistent prefix of
what was produced. Each trial crashes at a random moment; `benchmarks/power_loss_soak.py`
runs many more trials than this bounded smoke.
"""
from __future__ import annotations

import os
import random
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from fluvial.broker.log.sync_journal import ENV_VAR
from fluvial.client import connect
from tests.integration import test_pk_recovery as pk
from tests.support.broker_process import BrokerProcess
from tests.support.power_loss import lose_unsynced_writes

PARTITIONS = 2
TRIALS = 1  # per case here; benchmarks/power_loss_soak.py runs many


@dataclass
class Trial:
    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)
    seen: dict[tuple[int, int], bytes] = field(default_factory=dict)
    produced: int = 0
    survived: dict[tuple[int, int], bytes] = field(default_factory=dict)
    lost_bytes: int = 0
    loss: list[str] = field(default_factory=list)  # what the simulated power loss did, per segment


def read_everything(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False})
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[tuple[int, int], bytes] = {}
    deadline = time.monotonic() + 30
    while len(got) < sum(ends.values()) and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=0.5):
            if m.error() is None:
                got[(m.partition(), m.offset())] = m.value()
    c.close()
    assert len(got) == sum(ends.values()), f"read {len(got)} of {ends}"
    return got


def run_trial(root: Path, rng: random.Random, policy: str, acks: str, *, keep_before_loss: bool = False) -> Trial:
    """One broker life: produce and consume, kill -9 at a random moment, lose what was not
    fsynced, restart and read everything back. ``keep_before_loss``: copy the data directory
    and the journal to ``root / "before-loss"`` first, so a failing trial can be replayed."""
    root.mkdir(parents=True)
    journal = root / "sync.journal"
    os.environ[ENV_VAR] = str(journal)
    try:
        broker = BrokerProcess(root / "data", "--flush-policy", policy).start()
    finally:
        del os.environ[ENV_VAR]
    topic = "power"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(10)
    trial = Trial()
    stop = threading.Event()

    def consume():
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watcher", "enable.auto.commit": False,
                      "fetch.wait.max.ms": 20, "reconnect.backoff.max.ms": 100})
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        try:
            while not stop.is_set():
                for m in c.consume(500, timeout=0.05):
                    if m.error() is None:
                        trial.seen[(m.partition(), m.offset())] = m.value()
        finally:
            c.close()

    def on_delivery(err, msg):
        if err is None:
            trial.acked[(msg.partition(), msg.offset())] = msg.value()

    watcher = threading.Thread(target=consume)
    watcher.start()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": acks, "linger.ms": 2,
                         "message.send.max.retries": 0, "message.timeout.ms": 3000, "batch.num.messages": 100})
    crash_at = time.monotonic() + rng.uniform(0.5, 1.5)
    seq = 0
    while time.monotonic() < crash_at:
        try:
            value = f"v{seq:08d}-".encode() + b"x" * rng.randint(0, 300)
            producer.produce(topic, value=value, partition=seq % PARTITIONS, on_delivery=on_delivery)
            seq += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    broker.kill9()
    stop.set()
    watcher.join(10)
    # Successes reported now were answered before the kill; the rest fail.
    producer.flush(5)
    trial.produced = seq

    if keep_before_loss:
        shutil.copytree(root / "data", root / "before-loss" / "data")
        shutil.copy(journal, root / "before-loss" / journal.name)
    report = lose_unsynced_writes(journal, root / "data", rng)
    trial.loss = report.details
    trial.lost_bytes = report.bytes_lost
    broker.start()
    try:
        trial.survived = read_everything(broker.bootstrap, topic)
    finally:
        assert broker.stop() == 0
    return trial


def check_prefix(trial: Trial) -> None:
    """Per partition: offsets 0..n-1, each value produced once, in the order produced."""
    for part in range(PARTITIONS):
        offsets = sorted(o for (p, o) in trial.survived if p == part)
        assert offsets == list(range(len(offsets)))
        seqs = [int(trial.survived[(part, o)][1:9]) for o in offsets]
        assert seqs == sorted(set(seqs)), f"partition {part} is not an in-order prefix"
        assert all(s % PARTITIONS == part for s in seqs)


def violations(trial: Trial, policy: str, acks: str) -> dict[str, int]:
    """Records a power loss must not have taken, by kind (all zero when the contract held)."""
    out = {"seen_lost": 0, "acked_lost": 0}
    if policy == "ack":
        out["seen_lost"] = sum(1 for k, v in trial.seen.items() if trial.survived.get(k) != v)
        if acks == "all":
            out["acked_lost"] = sum(1 for k, v in trial.acked.items() if trial.survived.get(k) != v)
    return out


@pytest.mark.parametrize("acks", ["all", "1"])
def test_power_loss_under_flush_ack_keeps_every_acknowledged_and_every_seen_record(tmp_path, acks):
    rng = random.Random(11 if acks == "all" else 12)
    trials = [run_trial(tmp_path / f"trial{i}", rng, "ack", acks) for i in range(TRIALS)]
    for trial in trials:
        assert trial.seen, "the consumer saw nothing: visibility did not follow the fsyncs"
        check_prefix(trial)
        seen_lost = {k: v for k, v in trial.seen.items() if trial.survived.get(k) != v}
        assert not seen_lost, f"{len(seen_lost)} records a consumer saw are gone or changed"
        if acks == "all":
            assert trial.acked
            acked_lost = {k: v for k, v in trial.acked.items() if trial.survived.get(k) != v}
            assert not acked_lost, f"{len(acked_lost)} acknowledged records are gone or changed"


def test_power_loss_under_flush_none_leaves_a_consistent_prefix(tmp_path):
    rng = random.Random(13)
    trials = [run_trial(tmp_path / f"trial{i}", rng, "none", "1") for i in range(TRIALS)]
    for trial in trials:
        assert trial.acked
        check_prefix(trial)
    # Nothing forces data to disk under `none`: the simulated power loss did take some away.
    assert any(t.lost_bytes > 0 for t in trials)


def test_kv_tablet_ahead_of_a_log_that_lost_its_tail_is_rebuilt(fresh_broker, topic_name):
    """RocksDB (its WAL off) may persist a memtable holding changes whose log fsync a power
    loss then takes away. The KV tablet must not keep them: it is restored from a snapshot
    and the surviving changelog."""
    broker = fresh_broker("--flush-policy", "ack")
    pk.create(broker, topic_name)
    segment = broker.data_dir / "log" / f"{topic_name}-0" / f"{0:020d}.arrows"
    with connect(broker.flight_url) as client:
        t = client.table(topic_name)
        t.upsert(pk.batch_rows(0))
        t.snapshot()
        durable_size = segment.stat().st_size
        t.upsert(pk.batch_rows(1))
        t.delete(pa.table({"id": pa.array([0, 1, 2], pa.int64())}))
        t.snapshot()  # covers changes the log is about to lose
        assert 0 not in pk.state_of(t)
    # A clean stop persists RocksDB with every change; then the log loses what followed batch 0.
    assert broker.stop() == 0
    with open(segment, "r+b") as f:
        f.truncate(durable_size)
    for stale in segment.parent.glob("*.checkpoint"):
        if stale.name.startswith("recovery-point"):
            stale.unlink()
    broker.start()
    log = broker.log_tail(300)
    assert "ahead of its log" in log and "restored from snapshot" in log
    with connect(broker.flight_url) as client:
        t = client.table(topic_name)
        state = pk.state_of(t)
        assert state == pk.model_of([0])
        assert pk.changelog_state(t) == state
        assert t.lookup(pa.table({"id": pa.array([0], pa.int64())})).num_rows == 1
        # New changes reuse the lost offsets and go past them.
        t.upsert(pk.batch_rows(2))
        t.upsert(pk.batch_rows(3))
        expected = pk.state_of(t)
    assert expected == pk.model_of([0, 2, 3])
    # The snapshot of the lost history must never be restored, e.g. when RocksDB is lost now.
    assert broker.stop() == 0
    shutil.rmtree(broker.data_dir / "kv" / f"{topic_name}-0")
    broker.start()
    with connect(broker.flight_url) as client:
        assert pk.state_of(client.table(topic_name)) == expected
