"""Crash safety of lake tiering: the tiering job killed (SIGKILL) at each step of a round, and the
broker killed -9 at each step while it tiers itself; after restarts the lake equals the broker,
every log row once (no gap, no duplicate), the primary-key table's current state exactly."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest

import fluvial.client as fc
from fluvial.tiering.lake.catalog import open_catalog
from fluvial.tiering.lake.job import FAULT_ENV, STEPS, TieringWorker

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
KEYS = 50


class Tables:
    """A log table and a primary-key table, written through the table API, with what they must hold."""

    def __init__(self, client: fc.Client, create: bool = True):
        self.client = client
        if create:
            client.create_table("events", SCHEMA, buckets=2, lake=True, configs={"fluvial.lake.freshness": "1ms"})
            client.create_table("accounts", SCHEMA, buckets=2, primary_key=["id"], lake=True,
                                configs={"fluvial.lake.freshness": "1ms"})
        self.next_id = 0
        self.round = 0

    def write(self, client: fc.Client) -> None:
        self.round += 1
        ids = list(range(self.next_id, self.next_id + 200))
        self.next_id += 200
        client.table("events").append(pa.table({"id": ids, "name": [f"e{i}" for i in ids]}))
        accounts = client.table("accounts")
        accounts.upsert(pa.table({"id": list(range(KEYS)), "name": [f"r{self.round}-{k}" for k in range(KEYS)]}))
        accounts.delete(pa.table({"id": list(range(self.round % 5, KEYS, 5))}))

    def check(self, client: fc.Client) -> None:
        info = client.lake_info("events")
        catalog = open_catalog(info["catalog"])
        offsets = {str(o.bucket): o.high_watermark for o in client.table("events").offsets()}
        assert info["offsets"] == offsets
        lake = catalog.load_table(("fluvial", "events")).scan(selected_fields=("id", "_bucket", "_offset")).to_arrow()
        keys = list(zip(lake.column("_bucket").to_pylist(), lake.column("_offset").to_pylist()))
        assert len(keys) == len(set(keys)), "a log row is in the lake twice"
        log = client.table("events").scan(columns=["id", "_bucket", "_offset"]).to_arrow()
        assert sorted(lake.to_pylist(), key=lambda r: (r["_bucket"], r["_offset"])) == \
            sorted(log.to_pylist(), key=lambda r: (r["_bucket"], r["_offset"]))
        current = client.table("accounts").lookup(pa.table({"id": pa.array(range(KEYS), pa.int64())}))
        lake_pk = catalog.load_table(("fluvial", "accounts")).scan().to_arrow()
        assert sorted(lake_pk.to_pylist(), key=lambda r: r["id"]) == \
            sorted(current.select(["id", "name"]).to_pylist(), key=lambda r: r["id"])


def tier_until_caught_up(url: str, timeout: float = 60) -> None:
    worker = TieringWorker(url, job="clean", poll_s=0.1)
    deadline = time.monotonic() + timeout
    with fc.connect(url) as client:
        while any(s["lag_records"] or s["state"] != "tiered" for s in client.lake_status()):
            assert time.monotonic() < deadline, client.lake_status()
            if worker.run_once() is None:
                time.sleep(0.2)


def test_job_killed_at_each_step(fresh_broker):
    broker = fresh_broker("--lake-lease-ms", "1000")
    with fc.connect(broker.flight_url) as client:
        tables = Tables(client)
        for step in STEPS:
            for table in ("events", "accounts"):
                tables.write(client)
                job = subprocess.run(
                    [sys.executable, "-m", "fluvial.tiering.lake", "--engine", "native", "--url", broker.flight_url,
                     "--table", table, "--rounds", "1", "--idle-exit", "10", "--poll", "0.1"],
                    env={**os.environ, FAULT_ENV: step}, capture_output=True, timeout=120)
                assert job.returncode == -9, (step, table, job.stderr.decode()[-3000:])
            # The dead jobs' leases expire; a clean job reconciles from the lake.
            time.sleep(1.1)
            tier_until_caught_up(broker.flight_url)
            tables.check(client)


def test_broker_killed_at_each_step_of_its_own_tiering(fresh_broker, monkeypatch):
    broker = fresh_broker("--lake-lease-ms", "1000")
    with fc.connect(broker.flight_url) as client:
        tables = Tables(client)
    # Every step of a round: before anything is written, with data files written but not
    # committed, committed but not reported, and just before the report.
    for step in STEPS:
        # Written while the broker does not tier, so that its next start has a round to do.
        broker.extra_args = ["--lake-lease-ms", "1000"]
        broker.restart()
        with fc.connect(broker.flight_url) as client:
            tables.write(client)
        broker.stop()
        broker.extra_args.append("--lake-tiering")
        monkeypatch.setenv(FAULT_ENV, step)
        broker.start()
        broker.proc.wait(60)  # the broker's tiering worker kills it (SIGKILL) at the step
        assert broker.proc.returncode == -9, broker.log_tail()
        broker.proc = None
        monkeypatch.delenv(FAULT_ENV)
        broker.start()
        deadline = time.monotonic() + 60
        with fc.connect(broker.flight_url) as client:
            while any(s["lag_records"] or s["state"] != "tiered" for s in client.lake_status()):
                assert time.monotonic() < deadline, client.lake_status()
                time.sleep(0.2)
            tables.check(client)
