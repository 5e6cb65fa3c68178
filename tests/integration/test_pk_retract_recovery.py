"""The `retract` engine survives kill -9 in the middle of a reordered changelog and the loss
of its RocksDB directory: the live rows per key come back from the logged input rows (and
snapshots), so state and changelog equal the model for every acknowledged write."""
from __future__ import annotations

import random
import shutil
import threading
import time

import pyarrow as pa

from fluvial.client import connect
from fluvial.client.errors import BrokerUnavailableError
from fluvial.errors import FluvialError
from tests.support.changelog_join import (T1, interleave, materialized, sequential_join, split_by_level,
                                          upsert_table)

IDS = 40
LEVELS = 6
BATCH = 25


def reordered_stream(seed: int, steps_count: int = 8000) -> tuple[list, list]:
    """A long join changelog (s1 rows moving between levels, s2 attrs changing), and its
    arrival order from 4 writers shuffled by level."""
    rnd = random.Random(seed)
    steps = [("s2", lv, lv) for lv in range(LEVELS)]
    for _ in range(steps_count):
        if rnd.random() < 0.9:
            steps.append(("s1", rnd.randrange(IDS), rnd.randrange(LEVELS) if rnd.random() < 0.95 else None))
        else:
            steps.append(("s2", rnd.randrange(LEVELS), rnd.randrange(4)))
    changes = sequential_join(steps)
    arrivals = [c for _, c in interleave(split_by_level(changes, 4), rnd)]
    return changes, arrivals


def batch_table(arrivals, i: int) -> pa.Table:
    rows = [{"_change": k, "id": a, "level": lv, "attr": at} for k, a, lv, at in arrivals[i * BATCH:(i + 1) * BATCH]]
    return pa.Table.from_pylist(rows, schema=pa.schema([pa.field("_change", pa.string()), *T1]))


def state_of(t) -> dict:
    return {r["id"]: (r["id"], r["level"], r["attr"]) for r in t.full_read().rows.to_pylist()}


def changelog_state(t) -> dict:
    log = t.scan(columns=["_offset", "_change", "id", "level", "attr"]).to_arrow().sort_by("_offset").to_pylist()
    out: dict = {}
    for r in log:
        row = (r["id"], r["level"], r["attr"])
        if r["_change"] in (1, 3):
            out[r["id"]] = row
        else:
            assert out.pop(r["id"]) == row
    return out


def test_kill9_mid_reordered_stream_keeps_every_acknowledged_write(fresh_broker, topic_name):
    changes, arrivals = reordered_stream(7)
    batches = (len(arrivals) + BATCH - 1) // BATCH
    assert batches > 30
    broker = fresh_broker("--flush-policy", "ack")
    with connect(broker.flight_url) as client:
        client.create_table(topic_name, T1, buckets=1, kafka_format="avro", primary_key=["id"],
                            merge_engine="retract")
    acked = 0  # batches 0..acked-1 are acknowledged
    rng = random.Random(3)
    for round_ in range(3):
        in_flight: list[int] = []
        stop = threading.Event()

        def write():
            nonlocal acked
            try:
                with connect(broker.flight_url) as client:
                    t = client.table(topic_name)
                    while not stop.is_set() and acked < batches:
                        in_flight[:] = [acked]
                        t.upsert(batch_table(arrivals, acked))
                        acked += 1
                        in_flight.clear()
            except BrokerUnavailableError:
                pass  # the broker died under us
            except FluvialError as exc:
                if "Invalid" in type(exc).__name__ or "internal error" in exc.message:
                    raise

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(0.4 + rng.random() * 0.8)
        broker.kill9()
        stop.set()
        writer.join(30)
        broker.start()
        with connect(broker.flight_url) as client:
            t = client.table(topic_name)
            state = state_of(t)
            candidates = [acked] + ([acked + 1] if in_flight else [])
            models = [materialized(arrivals[:n * BATCH])[0] for n in candidates]
            assert state in models, f"round {round_}: the state matches no acknowledged prefix"
            assert changelog_state(t) == state
            if in_flight and state == models[-1] and len(models) == 2:
                acked += 1  # the batch in flight was written before the kill
        assert acked < batches, "the stream ended before the kill: make it longer"
    # The rest of the stream after the last restart: the sequential result.
    with connect(broker.flight_url) as client:
        t = client.table(topic_name)
        for i in range(acked, batches):
            t.upsert(batch_table(arrivals, i))
        assert state_of(t) == upsert_table(changes) == materialized(arrivals)[0]
        assert changelog_state(t) == upsert_table(changes)
    assert "replayed" in broker.log_tail(3000)


def test_lost_rocksdb_is_restored_with_its_lists_from_snapshot_and_log(fresh_broker, topic_name):
    changes, arrivals = reordered_stream(11, 2000)
    half = len(arrivals) // 2 // BATCH
    broker = fresh_broker()
    with connect(broker.flight_url) as client:
        t = client.create_table(topic_name, T1, buckets=2, kafka_format="avro", primary_key=["id"],
                                merge_engine="retract")
        for i in range(half):
            t.upsert(batch_table(arrivals, i))
        t.snapshot()
        for i in range(half, half + 3):
            t.upsert(batch_table(arrivals, i))
        before, stats = state_of(t), t.kv_stats()
    broker.stop()
    shutil.rmtree(broker.data_dir / "kv" / f"{topic_name}-0")
    shutil.rmtree(broker.data_dir / "kv" / f"{topic_name}-1")
    broker.start()
    assert "restored from snapshot" in broker.log_tail(300)
    with connect(broker.flight_url) as client:
        t = client.table(topic_name)
        assert state_of(t) == before
        assert t.kv_stats() == stats
        # The hidden rows came back too: the rest of the stream still ends right.
        for i in range(half + 3, (len(arrivals) + BATCH - 1) // BATCH):
            t.upsert(batch_table(arrivals, i))
        assert state_of(t) == upsert_table(changes)
