"""The client's reader of remote segments (client/remote.py) against the rows of the log tablet
the segments were made from: offset cuts, projection, filters with batch skipping by
statistics, timestamps; against a local folder and a real moto_server S3 process."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from fluvial.broker.log import BatchMeta, LogConfig, LogTablet
from fluvial.client import remote
from fluvial.client.predicates import system_fields
from fluvial.errors import OffsetOutOfRangeError, UnknownColumnError
from fluvial.tiering.object_store import open_object_store
from fluvial.tiering.remote_segment import RemoteSegmentReader, local_segment_batches, upload_segment

TS = pa.timestamp("ms", tz="UTC")
HEADERS = pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]))
ROWS = 1000
BATCHES = 30
USERS = pa.schema([pa.field("id", pa.int64())] + [pa.field(f"c{c:02d}", pa.int64()) for c in range(19)])


def stored_batch(i: int) -> pa.RecordBatch:
    rng = np.random.default_rng(i)
    data = {"_timestamp": pa.array(np.arange(i * 1000, i * 1000 + ROWS, dtype=np.int64)).cast(TS),
            "_change": pa.array(np.zeros(ROWS, np.int8)), "_key": pa.nulls(ROWS, pa.binary()),
            "_headers": pa.array([[]] * ROWS, HEADERS), "id": pa.array(np.arange(i * ROWS, (i + 1) * ROWS))}
    for c in range(19):
        data[f"c{c:02d}"] = pa.array(rng.integers(0, 1 << 40, ROWS))
    return pa.RecordBatch.from_pydict(data)


@pytest.fixture(scope="module", params=["local", "s3"])
def tiered(request, tmp_path_factory):
    """30 batches in a log tablet, its offsets [0, 25000) uploaded as 3 remote segments."""
    tmp = tmp_path_factory.mktemp("stitch")
    tablet = LogTablet.open(tmp / "log", LogConfig(segment_bytes=1 << 30))
    for i in range(BATCHES):
        tablet.append(stored_batch(i), BatchMeta(-1, 0, 0, -1, -1))
    tablet.flush()  # only durable data is tiered
    if request.param == "local":
        description = {"url": (tmp / "remote").as_uri()}
        options = None
    else:
        server = request.getfixturevalue("moto_s3")
        description = {"url": f"s3://{server.create_bucket()}/p", "options": {"endpoint_url": server.endpoint_url}}
        options = server.options()
    stores = remote.StoreCache(options)
    store = stores.open(description)
    segments = [upload_segment(store, f"log/t/0/{lo}.parquet", local_segment_batches(tablet, lo, hi), tmp / "staging")
                for lo, hi in [(0, 10_000), (10_000, 20_000), (20_000, 25_000)]]
    log = remote.RemoteLog(description, segments, 25_000, 0)
    yield tablet, log, options
    stores.close()
    tablet.close()


def run(tiered, columns, filters, start, end):
    tablet, log, options = tiered
    stores = remote.StoreCache(options)  # a fresh store: its byte counter is this read's
    store = stores.open(log.store)
    plan = remote.plan_remote(0, USERS, columns, filters, system_fields())
    stats = remote.RemoteStats()
    batches, last = [], None
    for batch, offset in remote.read_remote(RemoteSegmentReader(), store, log, plan, start, end, stats, lambda: False):
        last = offset
        if batch is not None:
            batches.append(batch)
    bytes_read = store.stats.bytes_read
    stores.close()
    return pa.Table.from_batches(batches, schema=plan.out_schema), last, stats, bytes_read


def local_rows(tablet: LogTablet, start: int, end: int) -> pa.Table:
    out = pa.Table.from_batches([s.batch for s in tablet.read(0, 1 << 40)])
    return out.slice(start, end - start)


def same(a: pa.Table, b: pa.Table) -> bool:
    return a.column_names == b.column_names and all(
        a.column(n).combine_chunks().equals(b.column(n).combine_chunks()) for n in a.column_names)


def test_rows_equal_the_log_tablets_with_exact_cuts(tiered):
    tablet = tiered[0]
    for start, end in [(0, 25_000), (17, 9_999), (9_995, 10_005), (24_000, 25_000), (0, None)]:
        got, last, stats, _ = run(tiered, ["_offset", "id", "c03"], [], start, end)
        stop = 25_000 if end is None else end  # the remote log ends at 25,000
        want = local_rows(tablet, start, stop).select(["_offset", "id", "c03"])
        assert same(got, want), (start, end)
        assert last == stop
        assert stats.rows_sent == stop - start


def test_two_of_twenty_columns_fetch_a_fraction_of_the_bytes(tiered):
    full, _, _, full_bytes = run(tiered, None, [], 0, 25_000)
    narrow, _, _, narrow_bytes = run(tiered, ["id", "c01"], [], 0, 25_000)
    assert narrow.num_rows == full.num_rows == 25_000
    assert narrow.column("c01").equals(full.column("c01"))
    assert narrow_bytes <= 0.2 * full_bytes, (narrow_bytes, full_bytes)


def test_filters_skip_batches_and_filter_rows_like_the_broker(tiered):
    tablet = tiered[0]
    filters = [["id", "<", 3_010], ["c05", ">", 1 << 39]]
    got, last, stats, skipped_bytes = run(tiered, ["_offset", "_bucket", "id"], filters, 17, 25_000)
    rows = local_rows(tablet, 17, 25_000)
    mask = pc.and_(pc.less(rows["id"], 3_010), pc.greater(rows["c05"], 1 << 39))
    assert got.column("_offset").to_pylist() == rows.filter(mask).column("_offset").to_pylist()
    assert set(got.column("_bucket").to_pylist()) == {0}
    assert last == 25_000
    assert stats.batches_skipped == 21 and stats.batches_read == 25
    # Against the same columns unfiltered: the row groups of skipped batches (here the 2nd
    # and 3rd segments') are never fetched; footers always are.
    _, _, _, all_bytes = run(tiered, ["_offset", "_bucket", "id", "c05"], [], 17, 25_000)
    nothing, _, stats, footer_bytes = run(tiered, ["id"], [["id", "<", -1]], 17, 25_000)
    assert nothing.num_rows == 0 and stats.batches_skipped == stats.batches_read == 25
    assert skipped_bytes - footer_bytes < 0.5 * (all_bytes - footer_bytes), (skipped_bytes, all_bytes, footer_bytes)


def test_first_offset_at_a_timestamp_and_errors(tiered):
    _, log, options = tiered
    stores = remote.StoreCache(options)
    store = stores.open(log.store)
    assert remote.first_offset_at(RemoteSegmentReader(), store, log, 5_500) == 5_500
    assert remote.first_offset_at(RemoteSegmentReader(), store, log, 10 ** 9) is None
    stores.close()
    with pytest.raises(UnknownColumnError):
        remote.plan_remote(0, USERS, ["nope"], [], system_fields())
    with pytest.raises(OffsetOutOfRangeError):
        remote.check_start(remote.RemoteLog(log.store, log.segments, 25_000, 100), 99, "t", 0)


def test_footer_is_read_from_the_tail_only(tmp_path):
    import pyarrow.parquet as pq

    from fluvial.errors import CorruptRemoteDataError
    from fluvial.tiering.remote_segment import FOOTER_TAIL_BYTES, read_footer

    store = open_object_store((tmp_path / "remote").as_uri())
    for extra in (100, 3 * FOOTER_TAIL_BYTES):  # a footer inside the first tail read, and one past it
        path = tmp_path / f"f{extra}.parquet"
        table = pa.table({"a": np.arange(50_000)}).replace_schema_metadata({"big": "x" * extra})
        pq.write_table(table, path)
        store.put_file(path.name, path)
        size = store.size(path.name)
        store.stats.reset()
        footer = read_footer(store, path.name, size)
        assert footer.equals(pq.read_metadata(path))
        footer_bytes = int.from_bytes(path.read_bytes()[-8:-4], "little") + 8
        assert store.stats.gets == (1 if footer_bytes <= FOOTER_TAIL_BYTES else 2)
        assert store.stats.bytes_read == max(FOOTER_TAIL_BYTES, footer_bytes) < size
    store.put("bad.parquet", b"not a parquet object at all")
    with pytest.raises(CorruptRemoteDataError):
        read_footer(store, "bad.parquet", store.size("bad.parquet"))
