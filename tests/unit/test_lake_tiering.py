"""Lake tables: column mapping, per-key reduction of a changelog, commits guarded by the offsets they start from."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from fluvial.broker.config import parse_duration_ms, validate_topic_configs
from fluvial.errors import InvalidConfigError
from fluvial.tiering.lake import catalog as lake_catalog
from fluvial.tiering.lake.schema import lake_arrow_schema, lake_type
from fluvial.tiering.lake.writer import LakeConflictError, commit_round, reduce_changes, write_data_files


def test_durations_and_lake_configs():
    assert parse_duration_ms("30s") == 30_000
    assert parse_duration_ms("500ms") == 500
    assert parse_duration_ms("2min") == 120_000
    assert parse_duration_ms("250") == 250
    assert validate_topic_configs({"fluvial.lake.enable": "true", "fluvial.lake.freshness": "5s"})
    with pytest.raises(InvalidConfigError, match="true or false"):
        validate_topic_configs({"fluvial.lake.enable": "yes please"})
    with pytest.raises(InvalidConfigError, match="not a duration"):
        validate_topic_configs({"fluvial.lake.freshness": "soon"})


def test_lake_types():
    assert lake_type(pa.uint32()) == pa.int64()
    assert lake_type(pa.uint64()) == pa.decimal128(20, 0)
    assert lake_type(pa.timestamp("ms", tz="UTC")) == pa.timestamp("us", tz="UTC")
    assert lake_type(pa.dictionary(pa.int32(), pa.large_string())) == pa.string()
    assert lake_type(pa.list_(pa.int8())) == pa.list_(pa.field("item", pa.int32()))
    log = lake_arrow_schema(pa.schema([("value", pa.binary())]), None, raw=True)
    assert log.names == ["value", "_bucket", "_offset", "_timestamp"]
    pk = lake_arrow_schema(pa.schema([("id", pa.int64()), ("v", pa.string())]), ["id"], raw=False)
    assert pk.names == ["id", "v"] and not pk.field("id").nullable


def changelog(rows: list[tuple]) -> pa.Table:
    """rows: (k1, k2, v, offset, change)"""
    k1, k2, v, off, ch = zip(*rows)
    return pa.table({"k1": pa.array(k1, pa.int64()), "k2": pa.array(k2, pa.string()), "v": pa.array(v, pa.string()),
                     "_offset": pa.array(off, pa.int64()), "_change": pa.array(ch, pa.int8())})


def test_reduce_changes_follows_offsets_not_arrival_order():
    rows = [(1, "a", "v1", 0, 1), (2, "a", "w1", 1, 1), (1, "a", "v1", 2, 2), (1, "a", "v2", 3, 3),
            (2, "a", "w1", 4, 4), (1, "b", "x", 5, 1), (3, "a", "y", 6, 1), (3, "a", "y", 7, 4), (3, "a", "z", 8, 1)]
    expect_rows = {(1, "a"): "v2", (1, "b"): "x", (3, "a"): "z"}
    rng = np.random.default_rng(7)
    for _ in range(20):  # Spark tasks hand rows over in any order
        shuffled = changelog([rows[i] for i in rng.permutation(len(rows))])
        upserts, deleted = reduce_changes(shuffled, ["k1", "k2"])
        assert {(r["k1"], r["k2"]): r["v"] for r in upserts.to_pylist()} == expect_rows
        assert deleted.to_pylist() == [{"k1": 2, "k2": "a"}]
        assert upserts.column_names == ["k1", "k2", "v"]


@pytest.fixture()
def lake(tmp_path):
    return lake_catalog.open_catalog(lake_catalog.embedded_properties(tmp_path))


def test_round_commits_carry_offsets_and_refuse_a_stale_start(lake):
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    table = lake_catalog.ensure_lake_table(lake, "t", schema, None, raw=False)
    rows = pa.table({"id": [1, 2], "name": ["a", "b"], "_bucket": pa.array([0, 0], pa.int32()),
                     "_offset": [0, 1], "_timestamp": pa.array([1, 2], pa.timestamp("ms", tz="UTC"))})
    files = write_data_files(table.metadata, table.io, rows)
    first = commit_round(table, None, {0: 2, 1: 0}, data_files=files)
    stale = lake.load_table(("fluvial", "t"))
    assert lake_catalog.lake_state(stale)[:2] == (first, {0: 2, 1: 0})
    commit_round(table, first, {0: 3, 1: 0}, data_files=write_data_files(table.metadata, table.io, rows.slice(0, 1)))
    # A job that started from `first` too (its lease expired, another job committed) is refused.
    with pytest.raises(LakeConflictError):
        commit_round(stale, first, {0: 3, 1: 0}, data_files=write_data_files(stale.metadata, stale.io, rows))
    now = lake.load_table(("fluvial", "t"))
    assert now.scan().to_arrow().num_rows == 3
    assert json.loads(now.current_snapshot().summary["fluvial.offsets"]) == {"0": 3, "1": 0}


def test_schema_evolution_adds_columns(lake):
    v1 = pa.schema([("id", pa.int64())])
    table = lake_catalog.ensure_lake_table(lake, "e", v1, ["id"], raw=False)
    commit_round(table, None, {0: 1}, upserts=pa.table({"id": [1]}), deleted=pa.table({"id": pa.array([], pa.int64())}),
                 primary_key=["id"])
    v2 = pa.schema([("id", pa.int64()), ("note", pa.string())])
    table = lake_catalog.ensure_lake_table(lake, "e", v2, ["id"], raw=False)
    assert table.schema().column_names == ["id", "note"]
    assert table.schema().identifier_field_names() == {"id"}
    snap = table.current_snapshot().snapshot_id
    commit_round(table, snap, {0: 3}, upserts=pa.table({"id": [2], "note": ["n"]}),
                 deleted=pa.table({"id": pa.array([], pa.int64())}), primary_key=["id"])
    got = lake.load_table(("fluvial", "e")).scan().to_arrow().sort_by("id").to_pylist()
    assert got == [{"id": 1, "note": None}, {"id": 2, "note": "n"}]


def test_pk_round_replaces_and_deletes_keys(lake):
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    table = lake_catalog.ensure_lake_table(lake, "k", schema, ["id"], raw=False)
    s1 = commit_round(table, None, {0: 3}, upserts=pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}),
                      deleted=pa.table({"id": pa.array([], pa.int64())}), primary_key=["id"])
    commit_round(table, s1, {0: 6}, upserts=pa.table({"id": [2, 4], "v": ["B", "d"]}),
                 deleted=pa.table({"id": [3]}), primary_key=["id"])
    got = lake.load_table(("fluvial", "k")).scan().to_arrow().sort_by("id").to_pylist()
    assert got == [{"id": 1, "v": "a"}, {"id": 2, "v": "B"}, {"id": 4, "v": "d"}]


def test_composite_key_round(lake):
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.int64())])
    table = lake_catalog.ensure_lake_table(lake, "ck", schema, ["a", "b"], raw=False)
    n = 3000
    first = pa.table({"a": list(range(n)), "b": ["x"] * n, "v": [0] * n})
    s1 = commit_round(table, None, {0: n}, upserts=first, deleted=pa.table({"a": pa.array([], pa.int64()),
                                                                              "b": pa.array([], pa.string())}),
                      primary_key=["a", "b"])
    changed = pa.table({"a": list(range(0, n, 2)), "b": ["x"] * (n // 2), "v": [1] * (n // 2)})
    commit_round(table, s1, {0: 2 * n}, upserts=changed, deleted=pa.table({"a": [1], "b": ["x"]}),
                 primary_key=["a", "b"])
    got = {(r["a"], r["b"]): r["v"] for r in lake.load_table(("fluvial", "ck")).scan().to_arrow().to_pylist()}
    assert len(got) == n - 1 and (1, "x") not in got
    assert all(got[(a, "x")] == (1 if a % 2 == 0 else 0) for a, _ in got)


def test_round_schedule_keeps_the_worst_lag_under_the_freshness():
    from fluvial.tiering.lake.coordinator import SCHEDULE_MARGIN_MS, next_round_start_ms, smoothed_round_ms

    fresh = 30_000
    # The rule itself: freshness - 2 x smoothed duration - margin after the last start.
    assert next_round_start_ms(100_000, fresh, 4_000) == 100_000 + fresh - 8_000 - SCHEDULE_MARGIN_MS
    assert next_round_start_ms(100_000, fresh, None) == 100_000 + fresh - SCHEDULE_MARGIN_MS
    # Rounds as long as the freshness: never closer than a tenth of it.
    assert next_round_start_ms(100_000, fresh, 20_000) == 100_000 + 3_000
    assert next_round_start_ms(0, 1, 500) == 0
    # Smoothing: a slower round counts at once, a faster one pulls the estimate down gradually.
    assert smoothed_round_ms(None, 3_000) == 3_000
    assert smoothed_round_ms(3_000, 6_000) == 6_000
    assert smoothed_round_ms(6_000, 1_000) == 4_500
    assert smoothed_round_ms(4_500, 1_000) == 3_450

    # Simulated rounds of 1 to 6 s, each at most twice the smoothed duration of the rounds
    # before it (a round suddenly three times slower than usual is not covered); the job picks a due table up within its 0.5 s poll. A row appended just after
    # a round fixed its end offsets is committed when the next round ends.
    rng = np.random.default_rng(7)
    durations = [3_000]
    smoothed = [smoothed_round_ms(None, 3_000)]
    for _ in range(500):
        durations.append(int(np.clip(rng.uniform(0.5, 2.0) * smoothed[-1], 1_000, min(6_000, 2 * smoothed[-1]))))
        smoothed.append(smoothed_round_ms(smoothed[-1], durations[-1]))
    starts = [0]
    for i in range(len(durations) - 1):
        starts.append(next_round_start_ms(starts[i], fresh, smoothed[i]) + int(rng.uniform(0, 500)))
    worst = max(starts[i + 1] + durations[i + 1] - starts[i] for i in range(len(starts) - 1))
    assert worst <= fresh
    # The schedule is not needlessly eager either: rounds are spaced well apart.
    assert min(b - a for a, b in zip(starts, starts[1:])) > fresh // 4
