"""Scans as Arrow streams: DuckDB, Polars, pandas and pyarrow read them without a full copy,
with the client's memory bounded by a few batches, not by the result."""
from __future__ import annotations

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import fluvial.client as fc
from benchmarks import bench_client_streams as bench

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), ("score", pa.int32()), ("city", pa.string())])


@pytest.fixture
def table(broker, topic_name):
    with fc.connect(broker.flight_url) as client:
        t = client.create_table(topic_name, SCHEMA, buckets=2)
        for k in range(4):
            ids = list(range(k * 500, k * 500 + 500))
            t.append(pa.table({"id": ids, "score": pa.array([i % 100 for i in ids], pa.int32()),
                               "city": [["Oslo", "Lima", None][i % 3] for i in ids]}, schema=SCHEMA))
        yield t


def test_duckdb_polars_pandas_and_pyarrow_read_a_scan_as_a_stream(table):
    scan = table.scan(columns=["city", "score"], filter=(pc.field("score") >= 90) & pc.field("city").is_valid())
    want = scan.to_arrow()
    assert want.num_rows > 0
    by_city = {c: pc.sum(want.filter(pc.equal(want["city"], c))["score"]).as_py() for c in ("Oslo", "Lima")}

    got = duckdb.sql("select city, sum(score) as s, count(*) as n from scan group by city order by city").fetchall()
    assert {c: s for c, s, _ in got} == by_city and sum(n for *_, n in got) == want.num_rows
    assert duckdb.sql("select count(*) from scan").fetchall()[0][0] == want.num_rows  # a scan can be read again

    assert pl.DataFrame(scan).shape == (want.num_rows, 2)
    frame = scan.to_polars()
    assert frame.schema == pl.Schema({"city": pl.String, "score": pl.Int32})
    assert frame.sort(["city", "score"]).equals(pl.from_arrow(want).sort(["city", "score"]))
    lazy = scan.to_polars(lazy=True)
    agg = lazy.group_by("city").agg(pl.col("score").sum()).collect(engine="streaming")
    assert dict(agg.iter_rows()) == by_city
    assert lazy.select("score").head(5).collect().height == 5
    assert lazy.filter(pl.col("city") == "Oslo").select(pl.len()).collect().item() == \
        want.filter(pc.equal(want["city"], "Oslo")).num_rows

    key = [("score", "ascending"), ("city", "ascending")]
    assert pa.table(scan).sort_by(key).equals(want.sort_by(key))
    assert pa.RecordBatchReader.from_stream(scan).read_all().num_rows == want.num_rows
    df = scan.to_pandas()
    assert isinstance(df, pd.DataFrame) and len(df) == want.num_rows

    reader = scan.to_reader()
    assert reader.schema == pa.schema([("city", pa.string()), ("score", pa.int32())])
    assert sum(b.num_rows for b in reader) == want.num_rows


def test_a_reader_asks_nothing_until_read_and_can_be_left_early(table):
    offline = fc.Table(fc.connect("grpc://127.0.0.1:1"), table.info)
    reader = offline.scan(columns=["id"]).to_reader()  # no request yet: the schema is known
    assert reader.schema.names == ["id"]
    with pytest.raises(fc.BrokerUnavailableError):
        reader.read_next_batch()
    reader = table.scan(columns=["id"]).to_reader()
    assert reader.read_next_batch().num_rows > 0
    reader.close()  # the streams of every bucket end
    assert table.scan(columns=["id"]).to_arrow().num_rows == 2000


def test_stream_consumers_use_bounded_client_memory(fresh_broker):
    """3 million rows (about 60 MB received): DuckDB and a reader loop grow the client's
    peak RSS by a fraction of that; taking the whole result as one table does not."""
    broker = fresh_broker()
    with fc.connect(broker.flight_url) as client:
        bench.fill(client, 3_000_000)
    figures = {k: bench.run_child(k, broker.flight_url, timeout=300) for k in ("duckdb", "reader", "to_arrow")}
    received = figures["to_arrow"]["bytes_received"]
    assert received > 50e6 and all(f["rows"] == 3_000_000 for f in figures.values()), figures
    mb = received / 1e6
    assert figures["reader"]["rss_growth_mb"] < 0.35 * mb, figures
    assert figures["duckdb"]["rss_growth_mb"] < 0.6 * mb, figures
    assert figures["to_arrow"]["rss_growth_mb"] > 0.8 * mb, figures  # the measure sees a full copy
