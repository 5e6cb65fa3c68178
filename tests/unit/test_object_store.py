"""The object store contract, against a local folder and a real moto_server S3 process."""
from __future__ import annotations

import concurrent.futures

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fluvial.errors import InvalidConfigError, ObjectNotFound, ObjectStoreError
from fluvial.tiering.object_store import LocalObjectStore, S3ObjectStore, open_object_store


@pytest.fixture
def store(object_store):
    return object_store


def test_put_get_ranges_size(store):
    data = bytes(range(256)) * 40
    store.put("log/t-1/0/a.bin", data)
    assert store.get("log/t-1/0/a.bin") == data
    assert store.get("log/t-1/0/a.bin", 100, 200) == data[100:200]
    assert store.get("log/t-1/0/a.bin", 10_000) == data[10_000:]
    assert store.get("log/t-1/0/a.bin", 5, 5) == b""
    assert store.size("log/t-1/0/a.bin") == len(data)


def test_put_file_list_delete(store, tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(b"x" * 3_000_000)
    store.put_file("log/t/0/1.parquet", path)
    store.put("log/t/0/2.parquet", b"y")
    store.put("log/t/1/1.parquet", b"z")
    store.put("kv/t/0/snap", b"s")
    assert store.size("log/t/0/1.parquet") == 3_000_000
    assert store.list("log/t/0/") == ["log/t/0/1.parquet", "log/t/0/2.parquet"]
    assert store.list("log/") == ["log/t/0/1.parquet", "log/t/0/2.parquet", "log/t/1/1.parquet"]
    assert store.list("nothing/") == []
    store.delete(["log/t/0/1.parquet", "log/t/0/does-not-exist"])
    assert store.list("log/t/0/") == ["log/t/0/2.parquet"]
    assert not store.exists("log/t/0/1.parquet")


def test_missing_object_is_object_not_found(store):
    with pytest.raises(ObjectNotFound):
        store.get("no/such/key")
    with pytest.raises(ObjectNotFound):
        store.size("no/such/key")
    with pytest.raises(ObjectNotFound):
        store.open_input("no/such/key")


def test_replace_is_whole_object(store):
    store.put("manifest.json", b"old" * 1000)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        seen = set()
        writes = [pool.submit(store.replace, "manifest.json", (b"new%d" % i) * 1000) for i in range(8)]
        for _ in range(20):
            seen.add(store.get("manifest.json"))
        for w in writes:
            w.result()
    # Every read saw one whole version, never a mix or a truncated object.
    for value in seen:
        unit = value[:3] if value.startswith(b"old") else value[:4]
        assert value == unit * 1000


def test_open_input_reads_parquet_columns_by_range(store):
    table = pa.table({f"c{i}": pa.array(range(i, i + 50_000), pa.int64()) for i in range(10)})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="none")
    store.put("t.parquet", sink.getvalue().to_pybytes())
    store.stats.reset()
    with store.open_input("t.parquet") as f:
        got = pq.ParquetFile(f).read(columns=["c3"])
    assert got.column("c3").to_pylist() == table.column("c3").to_pylist()
    # One column of ten: far less than the whole object was read.
    assert store.stats.bytes_read < store.size("t.parquet") / 4


def test_urls_and_options(tmp_path):
    assert isinstance(open_object_store(str(tmp_path / "a")), LocalObjectStore)
    assert isinstance(open_object_store((tmp_path / "b").as_uri()), LocalObjectStore)
    s3 = open_object_store("s3://bkt/pre/fix", {"endpoint_url": "http://127.0.0.1:1", "secret_access_key": "k",
                                               "access_key_id": "a"})
    assert isinstance(s3, S3ObjectStore) and s3.url == "s3://bkt/pre/fix"
    assert s3.public_description() == {"url": "s3://bkt/pre/fix", "options": {"endpoint_url": "http://127.0.0.1:1"}}
    with pytest.raises(InvalidConfigError):
        open_object_store("s3:///nobucket")
    with pytest.raises(InvalidConfigError):
        open_object_store("gs://x/y")
    with pytest.raises(InvalidConfigError):
        open_object_store("s3://b/p", {"no_such_option": "1"})
    with pytest.raises(ValueError):
        open_object_store(str(tmp_path)).put("../escape", b"x")


def test_unreachable_s3_is_a_clear_error():
    from tests.support.broker_process import free_port

    s3 = open_object_store("s3://bkt/p", {"endpoint_url": f"http://127.0.0.1:{free_port()}",
                                          "access_key_id": "a", "secret_access_key": "b", "connect_timeout": "1",
                                          "max_attempts": "1"})
    with pytest.raises(ObjectStoreError):
        s3.put("k", b"v")
    with pytest.raises(ObjectStoreError):
        s3.list("")
