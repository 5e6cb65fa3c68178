"""Union reads of a lake-enabled log table that also tiers its log segments to the object
store (a local folder) and keeps no local copies of them: the lake covers the first part,
remote segments the next, the broker's local log the tail. The client's union read and
Spark's format("fluvial") return every row once, equal to a full Kafka read; a lake tiering
round that has to read remote-only offsets brings the lake up to date with the same rows."""
from __future__ import annotations

import time
import uuid

import pytest

pytest.importorskip("pyiceberg")

from fluvial.client import connect, union  # noqa: E402
from tests.integration.test_union_read_tiered import (  # noqa: E402
    LAKE, SCHEMA, kafka_rows, produce_json, tier,
)
from tests.support.broker_process import BrokerProcess  # noqa: E402

COLUMNS = ["id", "city", "amount", "_bucket", "_offset"]
BUCKETS = 2
# Small segments roll often; local.retention.ms=0 drops each local copy once it is uploaded.
# 8 KiB: a bucket's 750 rows of one produce take about 5 KiB stored, so the second of them
# after the lake's end rolls the segment (at 16 KiB three of them fit, and nothing past the
# lake's end was tiered).
REMOTE = {"remote.storage.enable": "true", "segment.bytes": str(8 * 1024),
          "local.retention.ms": "0", "retention.ms": "-1"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("union-remote") / "data", "--retention-check-interval-ms", "200",
                      "--remote-log-manager-interval-ms", "200").start()
    yield b
    b.stop()


def wait_remote_past(client, table: str, offsets: dict[int, int], timeout: float = 60) -> dict[int, dict]:
    """Until every bucket's local log starts past `offsets[bucket]` (what lies below is held
    by remote segments only)."""
    deadline = time.monotonic() + timeout
    while True:
        logs = {b: client._action("remote-segments", {"name": table, "table": table, "bucket": b, "start": 0})
                for b in offsets}
        if all(log["segments"] and log["local_start_offset"] > offsets[b] for b, log in logs.items()):
            return logs
        if time.monotonic() > deadline:
            raise AssertionError(f"offsets past {offsets} were not tiered in {timeout}s: {logs}")
        time.sleep(0.2)


def spark_rows(spark, broker, table: str) -> list[dict]:
    df = (spark.read.format("fluvial").option("url", broker.flight_url).option("table", table)
          .option("includeMetadata", "true").load())
    got = [{k: r[k] for k in COLUMNS} for r in df.collect()]
    return sorted(got, key=lambda r: (r["_bucket"], r["_offset"]))


def test_union_of_lake_and_remote_segments_equals_kafka_read(broker, spark):
    name = f"ur-{uuid.uuid4().hex[:8]}"
    with connect(broker.flight_url) as client:
        client.create_table(name, SCHEMA, buckets=BUCKETS, configs={**LAKE, **REMOTE})
        produce_json(broker, name, range(0, 1500), BUCKETS)
        tier(broker, name)
        t = client.table(name)
        lake_end = dict(t.lake_info().offsets)
        assert sum(lake_end.values()) == 1500
        # Three flushed produces: each bucket gets at least three batches of ~5 KiB, so a
        # segment past the lake's end closes (and is tiered) however the client batched them
        # (one produce of it all may reach a bucket as a single batch, which no segment size
        # rolls before a next append).
        for start in (1500, 3000, 4500):
            produce_json(broker, name, range(start, start + 1500), BUCKETS)
        logs = wait_remote_past(client, name, lake_end)
        expected = kafka_rows(broker, name)
        assert len(expected) == 6000

        # lake [0, lake end) + remote segments [lake end, local start) + the broker's local log
        scan = t.scan(columns=COLUMNS)
        assert isinstance(scan, union.UnionScan)
        assert scan.to_arrow().to_pylist() == expected
        assert scan.plan.log_start == lake_end and not scan.plan.gaps
        assert scan.stats.remote_segments >= 1 and scan.stats.remote_rows_sent >= 1
        assert all(logs[b]["local_start_offset"] < scan.plan.log_end[b] for b in range(BUCKETS))

        # The broker serves the remote part when the client does not read the store itself.
        with connect(broker.flight_url, remote_reads=False) as direct:
            assert direct.table(name).scan(columns=COLUMNS).to_arrow().to_pylist() == expected

        f = [("amount", ">=", 1000.0), ("city", "!=", "Lima")]
        got = t.scan(columns=["id"], filter=f).to_arrow()
        assert sorted(got["id"].to_pylist()) == sorted(
            r["id"] for r in expected if r["amount"] >= 1000 and r["city"] is not None and r["city"] != "Lima")

        assert spark_rows(spark, broker, name) == expected

        # A lake tiering round reads the remote-only offsets after the lake's end.
        tier(broker, name)
        lake = t.scan(columns=COLUMNS, source="lake").to_arrow().to_pylist()
        assert lake == expected
        scan = t.scan(columns=COLUMNS)
        assert scan.to_arrow().to_pylist() == expected
        assert sum(scan.plan.log_start.values()) == 6000
