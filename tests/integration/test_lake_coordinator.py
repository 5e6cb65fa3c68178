"""The broker's lake coordinator over Flight: lake-info, leases, heartbeats, refused late reports, status."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest

import fluvial.client as fc
from fluvial.errors import LakeLeaseError
from fluvial.tiering.lake.catalog import open_catalog
from fluvial.tiering.lake.job import NativeRoundIO, TieringWorker, Work, run_round

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def rows(lo: int, hi: int) -> pa.Table:
    return pa.table({"id": pa.array(range(lo, hi), pa.int64()), "name": [f"n{i}" for i in range(lo, hi)]})


def lake_rows(info: dict) -> pa.Table:
    return open_catalog(info["catalog"]).load_table(tuple(info["identifier"])).scan().to_arrow()


def test_lake_info_leases_and_late_reports(fresh_broker):
    broker = fresh_broker("--lake-lease-ms", "3000")
    with fc.connect(broker.flight_url) as client:
        plain = client.create_table("plain", SCHEMA)
        assert client.lake_info("plain") is None
        t = client.create_table("events", SCHEMA, buckets=2, lake=True)
        info = client.lake_info("events")
        assert info["format"] == "iceberg" and info["identifier"] == ["fluvial", "events"]
        assert info["snapshot_id"] is None and info["offsets"] == {} and info["freshness_ms"] == 30_000
        assert info["catalog"]["type"] == "sql"
        t.append(rows(0, 300), bucket=0)
        t.append(rows(300, 500), bucket=1)
        plain.append(rows(0, 10))

        work = client._action("lake-acquire", {"job": "a"})
        assert work["table"] == "events"
        assert work["start_offsets"] == {"0": 0, "1": 0} and work["end_offsets"] == {"0": 300, "1": 200}
        # Nothing else is due while the lease holds.
        assert client._action("lake-acquire", {"job": "b"}) is None
        client._action("lake-heartbeat", {"name": "events", "lease_id": work["lease_id"]})
        time.sleep(3.3)
        with pytest.raises(fc.FluvialError, match="expired"):
            client._action("lake-heartbeat", {"name": "events", "lease_id": work["lease_id"]})
        # The expired lease's table is handed out again, from the same offsets.
        again = client._action("lake-acquire", {"job": "b"})
        assert again["table"] == "events" and again["lease_id"] != work["lease_id"]
        assert again["start_offsets"] == work["start_offsets"]
        result = run_round(client, Work.from_json(again), NativeRoundIO(broker.flight_url))
        assert result.offsets == {0: 300, 1: 200} and result.rows == 500
        # The first job's late report is refused, with a clear error.
        with pytest.raises(LakeLeaseError, match="not held"):
            client._action("lake-complete", {"name": "events", "lease_id": work["lease_id"],
                                             "snapshot_id": result.snapshot_id, "offsets": {"0": 300, "1": 200}})
        with pytest.raises(fc.FluvialError, match="no offsets"):
            client._action("lake-complete", {"name": "events", "lease_id": "x"})
        info = client.lake_info("events")
        assert info["offsets"] == {"0": 300, "1": 200} and info["state"] == "tiered"
        assert info["metadata_location"].endswith(".metadata.json")
        got = lake_rows(info)
        assert sorted(got.column("id").to_pylist()) == list(range(500))
        assert got.column_names == ["id", "name", "_bucket", "_offset", "_timestamp"]
        # Not due again until its freshness interval passed.
        t.append(rows(500, 510), bucket=1)
        assert client._action("lake-acquire", {"job": "c"}) is None
        [status] = client.lake_status()
        assert status["table"] == "events" and status["lag_records"] == 10 and status["rounds"] == 1

        with pytest.raises(fc.FluvialError, match="not a duration"):
            client.create_table("bad", SCHEMA, lake=True, configs={"fluvial.lake.freshness": "whenever"})
        # Malformed requests get clear errors.
        with pytest.raises(fc.InvalidRequestError, match="'job'"):
            client._action("lake-acquire", {})
        with pytest.raises(fc.InvalidRequestError, match="'lease_id'"):
            client._action("lake-heartbeat", {"name": "events"})
        with pytest.raises(fc.InvalidRequestError, match="not a lake table"):
            client._action("lake-status", {"name": "plain"})
        with pytest.raises(fc.UnknownTableError):
            client.lake_info("missing")

        # A round that fails is reported: the table shows failed, with the job's error.
        client.create_table("failing", SCHEMA, lake=True).append(rows(0, 10))
        broken = TieringWorker(broker.flight_url, job="broken", catalog_options={"type": "no-such-catalog"},
                               tables=["failing"])
        with pytest.raises(Exception):
            broken.run_once()
        [status] = client.lake_status("failing")
        assert status["state"] == "failed" and "no-such-catalog" in status["error"] and status["lag_records"] == 10
        assert client._action("lake-acquire", {"job": "again", "tables": ["failing"]}) is None  # due after freshness


def test_alter_enables_lake_and_worker_tiers_rounds(fresh_broker):
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    broker = fresh_broker()
    with fc.connect(broker.flight_url) as client:
        t = client.create_table("late", SCHEMA)
        t.append(rows(0, 100))
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        resource = ConfigResource("topic", "late", incremental_configs=[
            ConfigEntry("fluvial.lake.enable", "true", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("fluvial.lake.freshness", "200ms", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(10)
        worker = TieringWorker(broker.flight_url, job="w", poll_s=0.1)
        assert worker.run_once().rows == 100
        t.append(rows(100, 150))
        time.sleep(0.3)
        assert worker.run_once().rows == 50
        got = lake_rows(client.lake_info("late"))
        assert sorted(got.column("id").to_pylist()) == list(range(150))
        # A new table of the same name gets a new lake table; the old one is kept aside.
        client.drop_table("late")
        client.create_table("late", SCHEMA, lake=True).append(rows(0, 5))
        assert client.lake_info("late")["offsets"] == {}
        assert worker.run_once().rows == 5
        assert sorted(lake_rows(client.lake_info("late")).column("id").to_pylist()) == list(range(5))
        names = open_catalog(client.lake_info("late")["catalog"]).list_tables("fluvial")
        assert len([n for n in names if n[1].startswith("late__")]) == 1


def test_status_and_describe_commands(fresh_broker):
    import subprocess
    import sys

    broker = fresh_broker()
    with fc.connect(broker.flight_url) as client:
        client.create_table("shown", SCHEMA, lake=True).append(rows(0, 40))
    TieringWorker(broker.flight_url).run_once()

    def fluvial(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "fluvial.broker", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    status = fluvial("lake", "status", "--url", broker.flight_url)
    assert "shown" in status and "tiered" in status and "0:40" in status
    described = fluvial("table", "describe", "shown", "--url", broker.flight_url)
    assert "tiered" in described and "0:40" in described
    import json
    [row] = json.loads(fluvial("lake", "status", "--url", broker.flight_url, "--json"))
    assert row["lag_records"] == 0 and row["buckets"] == [{"bucket": 0, "tiered": 40, "high_watermark": 40,
                                                          "lag_records": 0}]
    with pytest.raises(AssertionError):
        fluvial("lake", "status", "--url", broker.flight_url, "--table", "nope")
