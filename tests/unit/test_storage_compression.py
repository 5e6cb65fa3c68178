"""Storage compression: Arrow IPC buffer codecs per batch, readable whatever the config says now."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from fluvial.broker.config import validate_topic_configs
from fluvial.broker.log import LogConfig
from fluvial.broker.log.cleaner import CompactionConfig, clean
from fluvial.broker.log.segment_format import MIN_COMPRESSED_BATCH_BYTES, encode_batch
from fluvial.errors import InvalidConfigError
from tests.unit.test_log_support import all_rows, meta, open_tablet, records


def _body_sizes(tablet) -> list[int]:
    """The body size of each stored batch message, read with plain pyarrow."""
    sizes = []
    for info in tablet.segment_infos():
        with open(info.path, "rb") as f:
            reader = ipc.MessageReader.open_stream(pa.py_buffer(f.read()))
        for message in reader:
            if message.type == "record batch":
                sizes.append(message.body.size)
    return sizes


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_batches_read_back_equal_and_smaller(tmp_path, codec):
    plain = open_tablet(tmp_path / "plain")
    packed = open_tablet(tmp_path / "packed", compression=codec)
    for i in range(5):
        batch = records(500, value_size=200, tag=i)
        plain.append(batch, meta())
        packed.append(batch, meta())

    assert all_rows(packed).equals(all_rows(plain))
    assert packed.size_bytes < plain.size_bytes / 3  # repetitive values: far smaller
    # Projection reads the same columns back.
    assert all_rows(packed, ["_offset", "amount"]).equals(all_rows(plain, ["_offset", "amount"]))
    # Reopening verifies every batch's checksum over the compressed bytes.
    packed.close()
    assert all_rows(open_tablet(tmp_path / "packed", compression=codec)).equals(all_rows(plain))


def test_config_change_mixes_codecs_in_one_segment_and_all_stay_readable(tmp_path):
    tablet = open_tablet(tmp_path, compression="none")
    tablet.append(records(300, tag=0), meta())
    tablet.config = LogConfig(**{**tablet.config.__dict__, "compression": "zstd"})
    tablet.append(records(300, tag=1), meta())
    tablet.config = LogConfig(**{**tablet.config.__dict__, "compression": "lz4"})
    tablet.append(records(300, tag=2), meta())

    assert len(tablet.segment_infos()) == 1
    sizes = _body_sizes(tablet)
    assert sizes[1] < sizes[0] / 2 and sizes[2] < sizes[0] * 0.6
    expected = pa.Table.from_batches([records(300, tag=t) for t in range(3)])
    assert all_rows(tablet).drop_columns(["_offset"]).equals(expected)
    tablet.close()
    # Any Arrow reader decodes the mixed segment: the codec is in each batch's header.
    [info] = open_tablet(tmp_path).segment_infos()
    assert ipc.open_stream(info.path).read_all().drop_columns(["_offset"]).equals(expected)


def test_auto_compresses_typed_tables_but_not_raw_value_bytes(tmp_path):
    typed = open_tablet(tmp_path / "typed", compression="auto")
    raw = open_tablet(tmp_path / "raw", compression="auto")
    batch = records(500, value_size=200)
    typed.append(batch, meta())
    raw.append(batch.drop_columns(["amount"]), meta())
    uncompressed = encode_batch(batch.drop_columns(["amount"]).add_column(0, "_offset", pa.array(range(500))),
                                meta())

    assert typed.compression_for(batch.schema) == "zstd"
    assert raw.compression_for(batch.drop_columns(["amount"]).schema) == "none"
    assert _body_sizes(raw) == [uncompressed.body.size]
    assert _body_sizes(typed)[0] < uncompressed.body.size / 3


def test_small_batches_stay_uncompressed(tmp_path):
    batch = records(2).add_column(0, "_offset", pa.array([0, 1], pa.int64()))
    assert batch.get_total_buffer_size() < MIN_COMPRESSED_BATCH_BYTES
    assert encode_batch(batch, meta(), compression="zstd").body.size == encode_batch(batch, meta()).body.size


def test_unknown_codec_is_refused():
    batch = records(2).add_column(0, "_offset", pa.array([0, 1], pa.int64()))
    with pytest.raises(ValueError, match="unknown storage compression"):
        encode_batch(batch, meta(), compression="brotli")
    with pytest.raises(InvalidConfigError):
        validate_topic_configs({"fluvial.storage.compression": "gzip"})
    assert validate_topic_configs({"fluvial.storage.compression": "lz4"}) == {"fluvial.storage.compression": "lz4"}


def _compacted(directory, codec: str):
    tablet = open_tablet(directory, compression=codec, retention_ms=-1)
    for i in range(6):
        tablet.append(records(200, tag=i % 2), meta())  # keys repeat: tags 0 and 1 only
    tablet.roll()
    tablet.append(records(1, tag=9), meta())  # the active segment is never cleaned
    before = all_rows(tablet)
    clean(tablet, CompactionConfig(min_cleanable_dirty_ratio=0.0), now_ms=2_000_000_000_000)
    return tablet, before


def test_compaction_writes_cleaned_batches_with_the_table_codec(tmp_path):
    tablet, before = _compacted(tmp_path / "zstd", "zstd")
    plain, _ = _compacted(tmp_path / "none", "none")

    after = all_rows(tablet)
    assert after.num_rows == 401
    latest = {k: v for k, v in zip(before.column("_key").to_pylist(), before.column("value").to_pylist())}
    assert dict(zip(after.column("_key").to_pylist(), after.column("value").to_pylist())) == latest
    assert after.equals(all_rows(plain))
    assert tablet.size_bytes < plain.size_bytes / 2


def test_projection_of_compressed_batches_decompresses_only_the_columns_asked_for(tmp_path):
    tablet = open_tablet(tmp_path, compression="zstd")
    for i in range(10):
        tablet.append(records(1000, value_size=500, tag=i), meta())
    tablet.close()

    tablet = open_tablet(tmp_path, compression="zstd")
    allocated_before = pa.total_allocated_bytes()
    stored = tablet.read(0, 1 << 30, columns=["amount", "_offset"])
    allocated = pa.total_allocated_bytes() - allocated_before

    assert [s.batch.schema.names for s in stored] == [["amount", "_offset"]] * 10
    assert pa.concat_arrays([s.batch.column("amount") for s in stored]).to_pylist() == [
        i * 1000 + j for i in range(10) for j in range(1000)]
    # Two int64 columns of 10,000 rows decompressed (160 KB), not the 5 MB of values.
    assert allocated < 400_000
    assert tablet.offset_for_timestamp(1_700_000_000_500) == (500, 1_700_000_000_500)
    assert tablet.max_timestamp() == (999, 1_700_000_000_999)


def test_read_with_uses_decompresses_only_those_user_columns_of_any_schema(tmp_path):
    tablet = open_tablet(tmp_path, compression="zstd")
    tablet.append(records(1000, value_size=500, tag=0), meta())
    tablet.append(records(1000, value_size=500, tag=1, extra_column=True), meta())  # a later schema
    tablet.close()
    tablet = open_tablet(tmp_path, compression="zstd")

    allocated_before = pa.total_allocated_bytes()
    stored = tablet.read(0, 1 << 30, uses={"amount", "note"})
    allocated = pa.total_allocated_bytes() - allocated_before

    assert [s.batch.schema.names for s in stored] == [
        ["_offset", "_timestamp", "_change", "_key", "_headers", "amount"],
        ["_offset", "_timestamp", "_change", "_key", "_headers", "amount", "note"]]
    assert stored[1].batch.column("note").to_pylist()[:2] == ["n0", "n1"]
    assert allocated < 600_000  # not the 1 MB of values
    # Uncompressed batches come whole (zero-copy costs nothing).
    plain = open_tablet(tmp_path / "plain")
    plain.append(records(1000, value_size=500), meta())
    assert "value" in plain.read(0, 1 << 30, uses={"amount"})[0].batch.schema.names


def test_zstd_delta_segments_read_back_equal_smaller_than_zstd_and_mix_with_other_codecs(tmp_path):
    zstd = open_tablet(tmp_path / "zstd", compression="zstd")
    delta = open_tablet(tmp_path / "delta", compression="zstd")
    delta.append(records(500, value_size=200, tag=0), meta())  # written before the change: plain zstd
    delta.config = LogConfig(**{**delta.config.__dict__, "compression": "zstd-delta"})
    zstd.append(records(500, value_size=200, tag=0), meta())
    for i in range(1, 5):
        batch = records(500, value_size=200, tag=i)
        zstd.append(batch, meta())
        delta.append(batch, meta())
    assert all_rows(delta).equals(all_rows(zstd))
    assert all_rows(delta, ["_offset", "_key", "_headers"]).equals(all_rows(zstd, ["_offset", "_key", "_headers"]))
    assert delta.size_bytes < zstd.size_bytes
    delta.close()
    # Reopening verifies every batch's checksum over the stored bytes; the old batch reads too.
    reopened = open_tablet(tmp_path / "delta", compression="zstd-delta")
    assert all_rows(reopened).equals(all_rows(zstd))
    assert validate_topic_configs({"fluvial.storage.compression": "zstd-delta"}) == {
        "fluvial.storage.compression": "zstd-delta"}


def test_compaction_of_a_zstd_delta_table(tmp_path):
    tablet, before = _compacted(tmp_path / "delta", "zstd-delta")
    plain, _ = _compacted(tmp_path / "none", "none")
    after = all_rows(tablet)
    assert after.num_rows == 401 and after.equals(all_rows(plain))
