"""KV snapshots in the object store (a local folder, and a real moto_server S3 process):
a primary-key table whose RocksDB and local snapshots are gone is restored from the remote
snapshot plus the changelog (itself partly remote), and clients read the table from the
remote snapshot without the broker reading the rows."""
from __future__ import annotations

import shutil
import time

import boto3
import pytest

from fluvial.client import connect
from tests.integration.test_pk_recovery import SCHEMA, batch_rows, changelog_state, model_of, state_of


def rows_of(table) -> dict:
    return {r["id"]: (r["payload"], r["n"]) for r in table.to_pylist()}


@pytest.fixture(params=["local", "s3"])
def remote_broker(request, fresh_broker):
    args = ["--retention-check-interval-ms", "200", "--remote-log-manager-interval-ms", "200"]
    options = None
    if request.param == "s3":
        moto = request.getfixturevalue("moto_s3")
        args += moto.broker_args(moto.create_bucket())
        options = moto.options()
    return fresh_broker(*args), options


def local_start(client, table: str, bucket: int) -> int:
    body = {"name": table, "table": table, "bucket": bucket, "start": 0}
    return client._action("remote-segments", body)["local_start_offset"]


def wipe_local_kv(broker) -> None:
    shutil.rmtree(broker.data_dir / "kv")
    shutil.rmtree(broker.data_dir / "kv-snapshots", ignore_errors=True)


def test_restore_from_remote_snapshot_and_tiered_changelog(remote_broker, topic_name):
    broker, options = remote_broker
    configs = {"remote.storage.enable": "true", "segment.bytes": str(256 * 1024), "local.retention.ms": "0"}
    with connect(broker.flight_url, object_store_options=options) as client:
        t = client.create_table(topic_name, SCHEMA, buckets=2, kafka_format="avro", primary_key=["id"],
                                configs=configs)
        for i in range(3):
            t.upsert(batch_rows(i))
        snaps = t.snapshot()
        assert len(snaps) == 2 and all(s["remote"] and s["remote"]["rows"] > 0 for s in snaps)
        at_snapshot = model_of([0, 1, 2])
        for i in range(3, 5):
            t.upsert(batch_rows(i))
        expected = model_of(range(5))
        # Wait until the changelog after each snapshot starts in remote-only data: a restore
        # then needs the remote snapshot and the remote changelog both.
        deadline = time.monotonic() + 60
        for b, snap in enumerate(snaps):
            while local_start(client, topic_name, b) <= snap["log_offset"]:
                assert time.monotonic() < deadline, "the changelog was not tiered"
                time.sleep(0.2)

        # A client reads the rows of the remote snapshots itself, then folds in the changelog.
        read = t.full_read(source="snapshot")
        assert read.sources == {0: "snapshot", 1: "snapshot"} and read.bytes_read > 0
        assert rows_of(read.rows) == at_snapshot
        assert read.offsets == {b: s["log_offset"] for b, s in enumerate(snaps)}
        assert rows_of(read.current()) == expected
        assert state_of(t) == expected
        # The changelog view reads its table's tiered log: remote part by the client.
        whole = t.scan(columns=["_offset", "_change", "id"]).to_arrow()
        view = client.table(topic_name + ".changelog").scan(columns=["_offset", "_change", "id"])
        assert view.to_arrow().sort_by("_offset").equals(whole.sort_by("_offset"))
        assert view.stats.remote_rows_sent > 0

    broker.stop()
    wipe_local_kv(broker)
    broker.start()
    with connect(broker.flight_url, object_store_options=options) as client:
        t = client.table(topic_name)
        assert state_of(t) == expected
        assert changelog_state(t) == expected
    assert "restored from remote snapshot" in broker.log_tail(400)

    # kill -9 right after more writes, with the local RocksDB gone again.
    with connect(broker.flight_url) as client:
        client.table(topic_name).upsert(batch_rows(5))
    broker.kill9()
    wipe_local_kv(broker)
    broker.start()
    with connect(broker.flight_url) as client:
        assert state_of(client.table(topic_name)) == model_of(range(6))


def test_without_remote_storage_full_read_from_snapshot_falls_back_to_the_broker(remote_broker, topic_name):
    broker, options = remote_broker
    with connect(broker.flight_url, object_store_options=options) as client:
        t = client.create_table(topic_name, SCHEMA, kafka_format="avro", primary_key=["id"])
        t.upsert(batch_rows(0))
        assert all(s["remote"] is None for s in t.snapshot())
        read = t.full_read(source="snapshot")
        assert read.sources == {0: "broker"} and read.bytes_read == 0
        assert rows_of(read.rows) == model_of([0])
        with pytest.raises(ValueError):
            t.full_read(source="lake")


def test_store_down_keeps_local_snapshots_and_uploads_catch_up(fresh_broker, own_moto_s3, topic_name):
    bucket = own_moto_s3.create_bucket()
    broker = fresh_broker(*own_moto_s3.broker_args(bucket), "--remote-log-manager-interval-ms", "200")
    with connect(broker.flight_url, object_store_options=own_moto_s3.options()) as client:
        t = client.create_table(topic_name, SCHEMA, kafka_format="avro", primary_key=["id"],
                                configs={"remote.storage.enable": "true"})
        t.upsert(batch_rows(0))
        own_moto_s3.kill()
        t.upsert(batch_rows(1))  # writes go on while the store is down
        [down] = t.snapshot()
        assert down["remote"] is None and down["log_offset"] > 0  # the local snapshot stands
        own_moto_s3.start()
        own_moto_s3.create_bucket(bucket)  # moto keeps objects in memory: its restart lost them
        [up] = t.snapshot()
        assert up["remote"] is not None and up["remote"]["log_offset"] == up["log_offset"] >= down["log_offset"]
        read = t.full_read(source="snapshot")
        assert read.sources == {0: "snapshot"} and rows_of(read.rows) == model_of([0, 1])
        s3 = boto3.client("s3", endpoint_url=own_moto_s3.endpoint_url, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        assert s3.list_objects_v2(Bucket=bucket, Prefix="remote/kv/")["KeyCount"] > 0
        client.drop_table(topic_name)
    # A dropped table's remote snapshots go too.
    deadline = time.monotonic() + 30
    while s3.list_objects_v2(Bucket=bucket, Prefix="remote/kv/").get("KeyCount", 0):
        assert time.monotonic() < deadline, "the dropped table's KV snapshots stayed in the store"
        time.sleep(0.2)
