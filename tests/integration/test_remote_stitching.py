"""Client-side stitching: native scans read tiered offsets straight from the object store
(a local folder, and a real moto_server S3 process), then continue at the broker, and
return exactly the rows a Kafka consumer reads for the same range."""
from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition

import fluvial.client as fc
from tests.support.broker_process import BrokerProcess

N_COLUMNS = 20
BATCH_ROWS = 500
BATCHES = 60
# Small enough that the (zstd-compressed, typed) table spans several remote segments.
SEGMENT_BYTES = 256 * 1024


def schema20() -> pa.Schema:
    fields = [pa.field("id", pa.int64())]
    for i in range(1, N_COLUMNS):
        kind = (pa.int64(), pa.float64(), pa.string())[i % 3]
        fields.append(pa.field(f"c{i:02d}", kind))
    return pa.schema(fields)


def rows(batch: int) -> pa.Table:
    rng = np.random.default_rng(batch)
    n = BATCH_ROWS
    ids = np.arange(batch * n, (batch + 1) * n, dtype=np.int64)
    columns = {"id": ids}
    for f in schema20():
        if f.name == "id":
            continue
        if f.type == pa.int64():
            columns[f.name] = rng.integers(-10 ** 9, 10 ** 9, n)
        elif f.type == pa.float64():
            columns[f.name] = np.round(rng.normal(0, 1000, n), 3)
        else:
            columns[f.name] = pa.array([f"{f.name}-{v:08x}" for v in rng.integers(0, 2 ** 31, n)])
    return pa.table(columns, schema=schema20())


def tiering_args(kind: str, moto=None) -> list[str]:
    args = ["--retention-check-interval-ms", "200", "--remote-log-manager-interval-ms", "200"]
    if kind == "s3":
        args += moto.broker_args(moto.create_bucket())
    return args


def table_configs() -> dict[str, str]:
    return {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES),
            "local.retention.ms": "0", "retention.ms": "-1"}


def remote_log(client: fc.Client, table: str, bucket: int = 0) -> dict:
    return client._action("remote-segments", {"name": table, "table": table, "bucket": bucket, "start": 0})


def wait_tiered(client: fc.Client, table: str, local_start_at_least: int, timeout: float = 60) -> dict:
    """Until the broker's local log starts at or after the offset (the part before is remote only)."""
    deadline = time.monotonic() + timeout
    while True:
        log = remote_log(client, table)
        if log["segments"] and log["local_start_offset"] >= local_start_at_least:
            return log
        if time.monotonic() > deadline:
            raise AssertionError(f"offsets below {local_start_at_least} were not tiered in {timeout}s: {log}")
        time.sleep(0.2)


def kafka_read(bootstrap: str, topic: str, start: int, end: int) -> list[tuple[int, dict]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "stitch", "enable.auto.commit": False,
                  "fetch.max.bytes": 8 << 20})
    c.assign([TopicPartition(topic, 0, start)])
    out: list[tuple[int, dict]] = []
    deadline = time.monotonic() + 60
    while (not out or out[-1][0] < end - 1) and time.monotonic() < deadline:
        for m in c.consume(5000, timeout=1):
            if m.error() is None and m.offset() < end:
                out.append((m.offset(), json.loads(m.value())))
    c.close()
    return out


def start_tiered(kind: str, data_dir, moto, name: str):
    """A broker whose table has tiered its first segments: (broker, client, table name, local start)."""
    broker = BrokerProcess(data_dir, *tiering_args(kind, moto)).start()
    client = fc.connect(broker.flight_url, object_store_options=moto.options() if moto else None)
    table = client.create_table(name, schema20(), configs=table_configs())
    for b in range(BATCHES):
        table.append(rows(b))
    log = wait_tiered(client, name, BATCH_ROWS * BATCHES // 2)
    return broker, client, name, log["local_start_offset"]


@pytest.fixture(scope="module", params=["local", "s3"])
def tiered(request, tmp_path_factory):
    """One tiered table per store for the tests that only read it."""
    moto = request.getfixturevalue("moto_s3") if request.param == "s3" else None
    broker, client, name, local_start = start_tiered(request.param, tmp_path_factory.mktemp("tiered") / "data",
                                                     moto, f"t-{uuid.uuid4().hex[:10]}")
    yield broker, client, name, local_start
    client.close()
    broker.stop()


@pytest.fixture(params=["local", "s3"])
def own_tiered(request, tmp_path, topic_name):
    """A tiered table of this test's own (the test changes or damages it)."""
    moto = request.getfixturevalue("moto_s3") if request.param == "s3" else None
    broker, client, name, local_start = start_tiered(request.param, tmp_path / "data", moto, topic_name)
    yield broker, client, name, local_start
    client.close()
    broker.stop()


def test_scan_across_the_remote_local_boundary_equals_the_kafka_read(tiered):
    broker, client, name, local_start = tiered
    total = BATCH_ROWS * BATCHES
    table = client.table(name)
    scan = table.scan(columns=["_offset", *schema20().names])
    got = scan.to_arrow()
    expected = kafka_read(broker.bootstrap, name, 0, total)
    assert got.column("_offset").to_pylist() == [o for o, _ in expected] == list(range(total))
    assert got.drop_columns(["_offset"]).to_pylist() == [v for _, v in expected]
    # The tiered part came from the object store, the rest from the broker, nothing twice
    # (tiering goes on meanwhile: the local start only grows).
    assert scan.stats.remote_rows_sent >= local_start
    assert scan.stats.remote_rows_sent + scan.stats.rows_sent == total
    assert scan.stats.remote_bytes_read > 0

    # A range that starts in remote data and ends in local data, projected and filtered.
    lo, hi = local_start // 2 + 7, min(total, local_start + 3 * BATCH_ROWS + 11)
    cut = (lo + hi) // 2
    part = table.scan(columns=["_offset", "c02", "c03"], filter=[("id", ">=", cut), ("c01", ">", 0)],
                      start=lo, end=hi).to_arrow()
    want = [(o, v) for o, v in kafka_read(broker.bootstrap, name, lo, hi) if v["id"] >= cut and v["c01"] > 0]
    assert part.column("_offset").to_pylist() == [o for o, _ in want]
    assert part.column("c02").to_pylist() == [v["c02"] for _, v in want]
    assert part.column("c03").to_pylist() == [v["c03"] for _, v in want]

    # Remote only: ends before the local start.
    early = table.scan(columns=["_offset", "id"], start=5, end=local_start - 3)
    assert early.to_arrow().column("_offset").to_pylist() == list(range(5, local_start - 3))
    assert early.stats.rows_sent == 0


def test_projection_of_remote_data_fetches_only_those_columns(tiered):
    _, client, name, local_start = tiered
    table = client.table(name)
    end = local_start  # remote data only
    full = table.scan(end=end)
    assert full.to_arrow().num_rows == end
    narrow = table.scan(columns=["id", "c01"], end=end)
    got = narrow.to_arrow()
    assert got.num_rows == end and got.column_names == ["id", "c01"]
    assert narrow.stats.remote_bytes_read <= 0.2 * full.stats.remote_bytes_read, (narrow.stats, full.stats)


def test_filters_skip_remote_batches_by_statistics(tiered):
    _, client, name, local_start = tiered
    table = client.table(name)
    low = BATCH_ROWS * 3 + 10
    scan = table.scan(columns=["id"], filter=[("id", "<", low)], end=local_start)
    got = scan.to_arrow()
    assert got.column("id").to_pylist() == list(range(low))
    stats = scan.stats
    assert stats.remote_batches_skipped >= stats.remote_batches_read - 5, stats
    everything = table.scan(columns=["id"], end=local_start)
    everything.to_arrow()
    # Footers are always read (they hold the statistics); the row groups of skipped
    # batches are not.
    nothing = table.scan(columns=["id"], filter=[("id", "<", -1)], end=local_start)
    assert nothing.to_arrow().num_rows == 0
    footers = nothing.stats.remote_bytes_read
    assert nothing.stats.remote_batches_skipped == nothing.stats.remote_batches_read > 0
    # Only the first of at least four remote segments has a matching batch.
    assert stats.remote_segments >= 4
    assert stats.remote_bytes_read - footers < (everything.stats.remote_bytes_read - footers) / 2


def test_timestamps_and_bad_offsets(tiered):
    _, client, name, local_start = tiered
    table = client.table(name)
    ts = table.scan(columns=["_offset", "_timestamp"], end=local_start).to_arrow()
    target = ts.column("_timestamp")[BATCH_ROWS * 2 + 3].as_py()
    first = min(o for o, t in zip(ts.column("_offset").to_pylist(), ts.column("_timestamp").to_pylist())
                if t >= target)
    got = table.scan(columns=["_offset"], start=target, end=local_start + 10).to_arrow()
    assert got.column("_offset")[0].as_py() == first
    assert got.column("_offset").to_pylist() == list(range(first, local_start + 10))
    with pytest.raises(fc.UnknownColumnError):
        table.scan(columns=["nope"], end=10).to_arrow()
    with pytest.raises(fc.InvalidRequestError):
        table.scan(columns=["id"], filter=[("id", "~", 1)], end=10).to_arrow()


def test_local_segments_deleted_while_reading_are_read_remotely(tiered, monkeypatch):
    """The broker deletes local copies between the client's question and its switch to the
    broker: the broker refuses the offset and the client asks again and reads it remotely."""
    broker, client, name, local_start = tiered
    real = client.remote_log
    calls = []

    def stale(table: str, bucket: int, start: int):
        log = real(table, bucket, start)
        calls.append(start)
        if len(calls) == 1 and log is not None and len(log.segments) > 1:
            # What the broker said before it tiered its last segments and deleted their local copies.
            log.segments = log.segments[:1]
            log.local_start_offset = log.segments[0].next_offset
        return log

    monkeypatch.setattr(client, "remote_log", stale)
    total = BATCH_ROWS * BATCHES
    got = client.table(name).scan(columns=["_offset", "id"]).to_arrow()
    assert got.column("_offset").to_pylist() == list(range(total))
    assert got.column("id").to_pylist() == list(range(total))
    assert len(calls) >= 2


def test_without_remote_reads_the_broker_serves_everything(tiered):
    broker, client, name, local_start = tiered
    total = BATCH_ROWS * BATCHES
    with fc.connect(broker.flight_url, remote_reads=False) as plain:
        table = plain.table(name)
        assert table.offsets()[0].log_start == 0  # the remote log's start
        scan = table.scan(columns=["_offset", "id"])
        got = scan.to_arrow()
        assert got.column("id").to_pylist() == list(range(total))
        assert scan.stats.remote_bytes_read == 0 and scan.stats.rows_sent == total
        # Filters skip remote batches in the broker too; timestamps find remote offsets.
        filtered = table.scan(columns=["id"], filter=[("id", "<", 1200)])
        assert filtered.to_arrow().column("id").to_pylist() == list(range(1200))
        assert filtered.stats.batches_skipped >= BATCHES - 5
        ts = table.scan(columns=["_timestamp"], end=10).to_arrow().column("_timestamp")[7].as_py()
        first = table.scan(columns=["_offset"], start=ts, end=local_start).to_arrow().column("_offset")
        assert first[0].as_py() <= 7 and first.to_pylist() == list(range(first[0].as_py(), local_start))


def test_a_store_the_client_cannot_reach_leaves_the_remote_part_to_the_broker(tiered):
    broker, client, name, local_start = tiered
    if not client.object_store_options:
        pytest.skip("a local folder store is readable from this machine")
    from tests.support.broker_process import free_port

    dead = {**client.object_store_options, "endpoint_url": f"http://127.0.0.1:{free_port()}",
            "max_attempts": "1", "connect_timeout": "1"}
    with fc.connect(broker.flight_url, object_store_options=dead) as lost:
        scan = lost.table(name).scan(columns=["_offset", "id"])
        got = scan.to_arrow()
    assert got.column("_offset").to_pylist() == list(range(BATCH_ROWS * BATCHES))
    assert scan.stats.remote_rows_sent == 0 and scan.stats.rows_sent == BATCH_ROWS * BATCHES


def test_a_corrupt_remote_segment_is_an_error_not_wrong_rows(own_tiered):
    broker, client, name, local_start = own_tiered
    if client.object_store_options:
        pytest.skip("the object is corrupted in the local folder store")
    objects = sorted((broker.data_dir / "remote" / "log").rglob("*.parquet"))
    assert objects
    data = bytearray(objects[0].read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)
    objects[0].write_bytes(bytes(data))
    with pytest.raises(fc.FluvialError) as err:
        client.table(name).scan(columns=["_offset", *schema20().names]).to_arrow()
    assert "remote segment" in str(err.value)
    # The broker keeps serving the offsets it holds locally.
    tail = client.table(name).scan(columns=["id"], start=BATCH_ROWS * BATCHES - 10).to_arrow()
    assert tail.column("id").to_pylist() == list(range(BATCH_ROWS * BATCHES - 10, BATCH_ROWS * BATCHES))


def test_follow_from_the_start_reads_remote_then_local_then_new_rows(own_tiered):
    broker, client, name, local_start = own_tiered
    total = BATCH_ROWS * BATCHES
    table = client.table(name)
    seen: list[int] = []
    scan = table.scan(columns=["_offset", "id"], start="earliest")
    appended = False
    for batch in scan.follow():
        seen.extend(batch.column("_offset").to_pylist())
        if len(seen) >= total and not appended:
            table.append(rows(BATCHES))  # a new batch while following
            appended = True
        if len(seen) >= total + BATCH_ROWS:
            break
    assert seen == list(range(total + BATCH_ROWS))
    assert scan.stats.remote_rows_sent >= local_start  # the tiered part came from the store
