"""`fluvial table copy` and `fluvial table load` against a running broker: every row arrives,
in order, with progress drawn on a terminal and a summary line at the end."""
from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

import fluvial.client as fc
from fluvial.broker.table_copy import copy_table

RUN = "import sys; from fluvial.broker.cli import main; sys.exit(main(sys.argv[1:]))"
SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("city", pa.string()), pa.field("amount", pa.float64())])


def fluvial(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=timeout)


def _rows(n: int, first: int = 0) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "city": [["Oslo", "Lima", "Pune"][i % 3] for i in ids],
                     "amount": pa.array([i / 10 for i in ids], pa.float64())}, schema=SCHEMA)


def test_load_a_parquet_file_then_copy_filtered_columns(broker, topic_name, tmp_path):
    url = ["--url", broker.flight_url]
    with fc.connect(broker.flight_url) as client:
        client.create_table(topic_name, SCHEMA, buckets=3)
    path = tmp_path / "orders.parquet"
    pq.write_table(_rows(60_000), path, row_group_size=20_000)

    done = fluvial("table", "load", topic_name, str(path), *url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"loaded 60,000 rows from {path} into {topic_name}")

    done = fluvial("table", "copy", topic_name, f"{topic_name}-lima", "--columns", "id,amount",
                   "--where", "city = Lima", "--create", *url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"copied 20,000 rows from {topic_name} to {topic_name}-lima")

    with fc.connect(broker.flight_url) as client:
        copied = client.table(f"{topic_name}-lima").scan().to_arrow()
        assert copied.column_names == ["id", "amount"]
        assert sorted(copied["id"].to_pylist()) == list(range(1, 60_000, 3))
        loaded = client.table(topic_name).scan(columns=["id"]).to_arrow()
        assert sorted(loaded["id"].to_pylist()) == list(range(60_000))


def test_copy_draws_progress_and_refuses_bad_input(broker, topic_name, tmp_path, capsys):
    with fc.connect(broker.flight_url) as client:
        src = client.create_table(topic_name, SCHEMA, buckets=2)
        src.append(_rows(70_000))
        client.create_table(f"{topic_name}-copy", SCHEMA)
        assert copy_table(client, topic_name, f"{topic_name}-copy", progress=True) == 70_000
        err = capsys.readouterr().err
        assert f"copy {topic_name} -> {topic_name}-copy" in err and "70000/" in err and "100%" in err
        assert client.table(f"{topic_name}-copy").refresh().info.offsets[0].high_watermark == 70_000

    bad = fluvial("table", "copy", "no-such-table", f"{topic_name}-x", "--url", broker.flight_url)
    assert bad.returncode == 1 and "no-such-table" in bad.stderr and "Traceback" not in bad.stderr
    csv = tmp_path / "wrong.csv"
    csv.write_text("id,colour\n1,red\n")
    bad = fluvial("table", "load", topic_name, str(csv), "--url", broker.flight_url)
    assert bad.returncode == 1 and "has no column(s) ['city', 'amount']" in bad.stderr
    bad = fluvial("table", "load", topic_name, str(tmp_path / "x.txt"), "--url", broker.flight_url)
    assert bad.returncode != 0 and "load reads .parquet" in bad.stderr
