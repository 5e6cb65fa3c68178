"""Primary-key tables give out only what a power loss cannot take back.

Under flush policy ``ack`` a lookup answers at once with the rows whose changelog is
fsynced (never waiting for an fsync under way), and a KV snapshot (local or remote) covers
only durable changelog offsets. fsyncs
of a bucket are held or failed on demand (``fluvial.broker.log.fault_injection``): while
the fsync of an upsert is held, its row is appended and in RocksDB but not durable. A
remote snapshot past a log end that went back (a lost log tail) is dropped on open.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from fluvial.broker.log.segment import DATA_SUFFIX
from fluvial.broker.log.fault_injection import ENV_VAR as FAULTS_ENV, held_marker
from fluvial.client import connect
from fluvial.client.errors import StorageError
from tests.integration.test_pk_recovery import SCHEMA, batch_rows, model_of
from tests.integration.test_pk_remote_snapshots import remote_broker, rows_of  # noqa: F401 - a fixture
from tests.support.broker_process import BrokerProcess

KV_SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])
PENDING_S = 1.0  # how long an answer must stay pending while the fsync it needs is held


@pytest.fixture
def held_broker(tmp_path, monkeypatch):
    faults = tmp_path / "fsync-faults"
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    broker = BrokerProcess(tmp_path / "data").start()
    yield broker, faults
    if broker.alive():
        broker.stop()


def wait_held(faults, futures) -> None:
    """Until an fsync of the held bucket waits (the write is appended, not durable)."""
    deadline = time.monotonic() + 20
    while not held_marker(faults).exists():
        for f in futures:
            if f.done():
                f.result()
                raise AssertionError("the write finished although its fsync is held")
        assert time.monotonic() < deadline, "no fsync was held"
        time.sleep(0.01)


@contextlib.contextmanager
def writers(faults, threads: int):
    """Threads for calls that wait on held fsyncs; whatever happens, the hold ends before
    the threads are joined (a failed check must not leave a write waiting for ever)."""
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        try:
            yield pool
        finally:
            faults.unlink(missing_ok=True)


def set_faults(faults: Path, text: str) -> None:
    """Rewrite the fault file in one step: a held fsync polls it, and a file read between a
    rewrite's truncation and its write would release the fsync as if no fault were set."""
    staged = faults.with_name(faults.name + ".new")
    staged.write_text(text)
    os.replace(staged, faults)


def call(url: str, name: str, method: str, *args):
    with connect(url) as client:
        return getattr(client.table(name), method)(*args)


def test_lookup_answers_from_durable_rows_while_an_fsync_is_held(held_broker):
    """A lookup never waits behind a write's fsync, and never gives out the write's rows
    before that fsync: while the fsync of an upsert is held (a disk that does not answer),
    lookups and prefix lookups answer at once with the rows as they were durable; once the
    fsync ends they see the new rows; when it fails the bucket is offline."""
    broker, faults = held_broker
    name = "pkdur"
    with connect(broker.flight_url) as client:
        client.create_table(name, KV_SCHEMA, primary_key=["id"])
        client.table(name).upsert(pa.table({"id": [1, 2], "v": ["durable", "old"]}, schema=KV_SCHEMA))
    url = broker.flight_url
    keys = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    with writers(faults, 4) as pool:
        set_faults(faults, f"hold {name}-0/\n")
        upsert = pool.submit(call, url, name, "upsert",
                             pa.table({"id": [2, 3], "v": ["pending", "new"]}, schema=KV_SCHEMA))
        wait_held(faults, [upsert])
        for method in ("lookup", "prefix_lookup"):
            started = time.monotonic()
            rows = pool.submit(call, url, name, method, keys).result(PENDING_S * 5)
            # In RocksDB already, but a power loss now would take the upsert back.
            assert sorted(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist())) == [
                (1, "durable"), (2, "old")], method
            assert time.monotonic() - started < PENDING_S * 5
        assert held_marker(faults).exists() and not upsert.done()  # the fsync is still held
        faults.unlink()  # the fsync completes
        upsert.result(20)
        for method in ("lookup", "prefix_lookup"):
            rows = call(url, name, method, keys)
            assert sorted(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist())) == [
                (1, "durable"), (2, "pending"), (3, "new")], method

        set_faults(faults, f"hold {name}-0/\n")
        upsert = pool.submit(call, url, name, "upsert", pa.table({"id": [3], "v": [None]}, schema=KV_SCHEMA))
        wait_held(faults, [upsert])
        rows = pool.submit(call, url, name, "lookup", pa.table({"id": pa.array([3], pa.int64())})).result(
            PENDING_S * 5)
        assert rows.column("v").to_pylist() == ["new"]
        set_faults(faults, f"{name}-0/\n")  # the held fsync fails: the bucket goes offline
        with pytest.raises(StorageError, match="offline"):
            upsert.result(20)
    with pytest.raises(StorageError, match="offline"):
        call(url, name, "lookup", pa.table({"id": pa.array([1], pa.int64())}))
    assert "Traceback" not in broker.log_tail(200)


def test_kv_snapshot_never_covers_offsets_that_are_not_durable(held_broker):
    broker, faults = held_broker
    name = "pksnap"
    url = broker.flight_url
    with connect(url) as client:
        t = client.create_table(name, KV_SCHEMA, primary_key=["id"])
        t.upsert(pa.table({"id": [1, 2], "v": ["a", "b"]}, schema=KV_SCHEMA))
        durable = t.offsets()[0].high_watermark
        assert durable > 0
    with writers(faults, 3) as pool:
        set_faults(faults, f"hold {name}-0/\n")
        upsert = pool.submit(call, url, name, "upsert", pa.table({"id": [3], "v": ["c"]}, schema=KV_SCHEMA))
        wait_held(faults, [upsert])
        snapshot = pool.submit(call, url, name, "snapshot")
        time.sleep(PENDING_S)
        if snapshot.done():  # taken at the durable offset, or it waits for the fsync
            assert [s["log_offset"] for s in snapshot.result()] == [durable]
        set_faults(faults, f"{name}-0/\n")  # the held fsync fails: those offsets are not the log's
        with pytest.raises(StorageError):
            upsert.result(20)
        if not snapshot.done() or snapshot.exception(20) is not None:
            with pytest.raises(StorageError, match="offline"):
                snapshot.result(20)
    with connect(url) as client:
        covered = [s["log_offset"] for s in client.table(name).snapshots()[0]]
    assert all(offset <= durable for offset in covered), (covered, durable)


def test_remote_snapshot_past_the_recovered_log_end_is_dropped(remote_broker, topic_name):  # noqa: F811
    broker, options = remote_broker
    with connect(broker.flight_url, object_store_options=options) as client:
        t = client.create_table(topic_name, SCHEMA, kafka_format="avro", primary_key=["id"],
                                configs={"remote.storage.enable": "true"})
        t.upsert(batch_rows(0))
        [first] = t.snapshot()
        log_dir = broker.data_dir / "log" / f"{topic_name}-0"
        kept = {p: p.stat().st_size for p in log_dir.glob("*" + DATA_SUFFIX)}
        t.upsert(batch_rows(1))
        [second] = t.snapshot()
        assert first["remote"] and second["remote"] and second["log_offset"] > first["log_offset"]
    # The disk loses the log's tail after the second snapshot went to the store (a disk
    # that acknowledged fsyncs it did not keep, a restored backup): those offsets are
    # given to other changes after the restart.
    broker.kill9()
    for path in log_dir.glob("*" + DATA_SUFFIX):
        if path in kept:
            with open(path, "r+b") as f:
                f.truncate(kept[path])
        else:
            path.unlink()
    # Derived files that may describe the lost tail: rebuilt from the segments.
    for pattern in ("*.index", "*.timeindex", "*.snapshot", "recovery-point.checkpoint"):
        for path in log_dir.glob(pattern):
            path.unlink()
    broker.start()
    with connect(broker.flight_url, object_store_options=options) as client:
        t = client.table(topic_name)
        assert t.offsets()[0].high_watermark == first["log_offset"]
        assert "remote KV snapshot" in broker.log_tail(400)
        read = t.full_read(source="snapshot")
        assert read.sources == {0: "snapshot"}
        assert read.offsets == {0: first["log_offset"]}
        assert rows_of(read.rows) == model_of([0])
        # New changes take the lost offsets: the snapshot the client reads stays in line with them.
        t.upsert(batch_rows(2))
        expected = model_of([0, 2])
        read = t.full_read(source="snapshot")
        assert read.offsets == {0: first["log_offset"]} and rows_of(read.current()) == expected
        [third] = t.snapshot()
        assert third["remote"] and rows_of(t.full_read(source="snapshot").rows) == expected
