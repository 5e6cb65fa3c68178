"""KV tablet: merge engines against a model dict, changelog replay, lookups, snapshots, recovery."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.errors import InvalidRecordError
from fluvial.kv import ChangeType, KeyLayout, KvTablet, MergeSpec, SnapshotStore
from fluvial.errors import InvalidConfigError

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string()),
                    pa.field("score", pa.int64()), pa.field("version", pa.int64())])
COLUMNS = ["id", "name", "score", "version"]


def open_tablet(path, engine="last_row", version=None, schema=SCHEMA, pk=("id",), bucket_key=None):
    spec = MergeSpec.of(schema, list(pk), engine, version)
    return KvTablet.open(path, schema, KeyLayout(schema, list(pk), bucket_key), spec)


def rows_of(dicts, columns=COLUMNS, schema=SCHEMA):
    return pa.RecordBatch.from_pylist(dicts, schema=pa.schema([schema.field(c) for c in columns]))


def state(tablet) -> dict:
    rows = [r for b in tablet.scan() for r in b.to_pylist()]
    return {r["id"]: r for r in rows}


def replay_changelog(changelog: list[dict]) -> dict:
    """Apply a changelog to an empty table, as a downstream consumer would."""
    out = {}
    for c in changelog:
        row = {k: c[k] for k in COLUMNS}
        if c["_change"] in (ChangeType.INSERT, ChangeType.UPDATE_AFTER):
            out[row["id"]] = row
        elif c["_change"] == ChangeType.DELETE:
            assert out.pop(row["id"]) == row, "a -D carries the row it deletes"
        elif c["_change"] == ChangeType.UPDATE_BEFORE:
            assert out[row["id"]] == row, "a -U carries the row it replaces"
    return out


# One operation: (kind, id, name, score, version).
ops = st.lists(st.lists(st.tuples(st.sampled_from(["upsert", "partial", "delete"]), st.integers(0, 5),
                                  st.sampled_from(["a", "b", None]), st.integers(0, 3), st.integers(0, 4)),
                        min_size=1, max_size=12), min_size=1, max_size=6)


def model_apply(model: dict, engine: str, kind: str, row: dict) -> None:
    key = row["id"]
    if kind == "delete":
        model.pop(key, None)
    elif engine == "first_row":
        model.setdefault(key, row)
    elif engine == "versioned":
        if key not in model or row["version"] >= model[key]["version"]:
            model[key] = row
    elif kind == "partial":
        old = model.get(key)
        model[key] = {**(old or {c: None for c in COLUMNS}), "id": key, "score": row["score"]}
    else:
        model[key] = row


@pytest.mark.parametrize("engine", ["last_row", "first_row", "versioned"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=ops)
def test_merge_engine_matches_model_and_changelog_replays(tmp_path_factory, engine, batches):
    path = tmp_path_factory.mktemp("kv") / "db"
    tablet = open_tablet(path, engine, "version" if engine == "versioned" else None)
    model: dict = {}
    changelog: list[dict] = []
    offset = 0
    for batch in batches:
        # The engines refuse deletes / partial updates except last_row: keep to what each takes.
        if engine != "last_row":
            batch = [("upsert",) + op[1:] for op in batch]
        # One write carries either partial updates or full rows (deletes ride with full rows).
        groups = [[op for op in batch if op[0] == "partial"], [op for op in batch if op[0] != "partial"]]
        for group in groups:
            if not group:
                continue
            rows = [dict(id=i, name=n, score=s, version=v) for _, i, n, s, v in group]
            deletes = np.array([op[0] == "delete" for op in group])
            if group[0][0] == "partial":
                write = tablet.prepare(rows_of([{"id": r["id"], "score": r["score"]} for r in rows], ["id", "score"]),
                                       partial_columns=["id", "score"])
            else:
                write = tablet.prepare(rows_of(rows), deletes=deletes if deletes.any() else None)
            for (kind, *_), r in zip(group, rows):
                model_apply(model, engine, kind, r)
            cl = write.changelog.to_pylist()
            changelog += cl
            offset += len(cl)
            if not write.empty:
                tablet.apply(write, offset)
        assert state(tablet) == model
    assert replay_changelog(changelog) == model
    # Nothing is emitted for a no-op: every -U is followed by its +U, with a different row.
    for a, b in zip(changelog, changelog[1:]):
        if a["_change"] == ChangeType.UPDATE_BEFORE:
            assert b["_change"] == ChangeType.UPDATE_AFTER and a["id"] == b["id"] and a != b
    tablet.close()


def test_replay_rebuilds_state_from_changelog(tmp_path):
    t = open_tablet(tmp_path / "a")
    write = t.prepare(rows_of([dict(id=1, name="x", score=1, version=0), dict(id=2, name="y", score=2, version=0),
                               dict(id=1, name="z", score=3, version=0)]))
    t.apply(write, 10)
    write2 = t.prepare(rows_of([dict(id=2, name=None, score=None, version=None)]), deletes=np.array([True]))
    t.apply(write2, 11)
    changelog = pa.Table.from_batches([write.changelog, write2.changelog]).to_pylist()
    assert [c["_change"] for c in changelog] == [1, 1, 2, 3, 4]
    stored = pa.Table.from_batches([write.changelog, write2.changelog])
    stored = stored.append_column("_offset", pa.array(np.arange(stored.num_rows), pa.int64()))
    fresh = open_tablet(tmp_path / "b")
    fresh.replay(stored.to_batches())
    assert state(fresh) == state(t) == {1: dict(id=1, name="z", score=3, version=0)}
    assert fresh.applied_offset == stored.num_rows


def test_identical_upsert_is_no_change(tmp_path):
    t = open_tablet(tmp_path / "a")
    r = rows_of([dict(id=1, name="x", score=1, version=0)])
    t.apply(t.prepare(r), 1)
    assert t.prepare(r).empty


def test_lookup_and_prefix_lookup(tmp_path):
    schema = pa.schema([pa.field("user", pa.string(), False), pa.field("item", pa.int32(), False),
                        pa.field("qty", pa.int64())])
    t = open_tablet(tmp_path / "a", schema=schema, pk=("user", "item"), bucket_key=["user"])
    rows = pa.RecordBatch.from_pylist([dict(user=u, item=i, qty=i * 10) for u in ["ann", "bob", "an"] for i in range(3)],
                                      schema=schema)
    t.apply(t.prepare(rows), 9)
    found = t.lookup(pa.table({"user": ["bob", "zed", "ann"], "item": [2, 0, 1]}))
    assert found.to_pylist() == [dict(user="bob", item=2, qty=20), dict(user="ann", item=1, qty=10)]
    got = t.prefix_lookup(pa.table({"user": ["ann"]})).to_pylist()
    assert sorted(r["item"] for r in got) == [0, 1, 2] and {r["user"] for r in got} == {"ann"}
    assert t.prefix_lookup(pa.table({"user": ["nobody"]})).num_rows == 0


@pytest.mark.parametrize("rows, kwargs, message", [
    ([{"name": "x"}], {}, "primary-key column"),
    ([{"id": None, "name": "x", "score": 1, "version": 1}], {}, "is null"),
    ([{"id": 1, "score": 1}], {"partial_columns": ["score"]}, "must name every primary-key column"),
    ([{"id": 1, "name": "x"}], {}, "lack column"),
])
def test_bad_writes_are_refused(tmp_path, rows, kwargs, message):
    t = open_tablet(tmp_path / "a")
    cols = list(rows[0])
    batch = pa.RecordBatch.from_pylist(rows, schema=pa.schema(
        [SCHEMA.field(c).with_nullable(True) for c in cols]))
    with pytest.raises(InvalidRecordError, match=message):
        t.prepare(batch, **kwargs)
    assert state(t) == {}


def test_wrong_key_type_is_refused(tmp_path):
    t = open_tablet(tmp_path / "a")
    batch = pa.RecordBatch.from_pylist([{"id": "one", "name": "x", "score": 1, "version": 1}])
    with pytest.raises(InvalidRecordError, match="id"):
        t.prepare(batch)


def test_versioned_needs_version_column_and_refuses_deletes(tmp_path):
    t = open_tablet(tmp_path / "a", "versioned", "version")
    with pytest.raises(InvalidRecordError, match="version column"):
        t.prepare(rows_of([dict(id=1, name="x", score=1)], ["id", "name", "score"]))
    with pytest.raises(InvalidRecordError, match="deletes are not supported"):
        t.prepare(rows_of([dict(id=1, name="x", score=1, version=1)]), deletes=np.array([True]))
    with pytest.raises(InvalidRecordError, match="partial updates"):
        t.prepare(rows_of([dict(id=1, score=1, version=1)], ["id", "score", "version"]),
                  partial_columns=["id", "score", "version"])


@pytest.mark.parametrize("engine, version, message", [
    ("versioned", None, "needs a version column"),
    ("versioned", "name", "must be an integer"),
    ("versioned", "nope", "not a column"),
    ("last_row", "version", "only used by merge engine 'versioned'"),
    ("newest", None, "Unknown merge engine"),
])
def test_merge_spec_validation(engine, version, message):
    with pytest.raises(InvalidConfigError, match=message):
        MergeSpec.of(SCHEMA, ["id"], engine, version)


def test_partial_update_of_new_key_needs_nullable_columns(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("a", pa.int64(), False), pa.field("b", pa.int64())])
    t = open_tablet(tmp_path / "a", schema=schema)
    with pytest.raises(InvalidRecordError, match="required column 'a'"):
        t.prepare(pa.RecordBatch.from_pylist([{"id": 1, "b": 2}]), partial_columns=["id", "b"])


def test_snapshot_restore_and_schema_evolution(tmp_path):
    t = open_tablet(tmp_path / "a")
    t.apply(t.prepare(rows_of([dict(id=i, name=str(i), score=i, version=0) for i in range(100)])), 100)
    store = SnapshotStore(tmp_path / "snaps", retain=2)
    infos = [store.take(t) for _ in range(3)]
    assert [s.snapshot_id for s in store.list()] == [2, 3] and infos[-1].log_offset == 100
    t.close()
    store.restore(store.latest(), tmp_path / "restored")
    wider = SCHEMA.append(pa.field("extra", pa.string()))
    r = open_tablet(tmp_path / "restored", schema=wider)
    assert r.applied_offset == 100
    assert r.lookup(pa.table({"id": [7]})).to_pylist() == [dict(id=7, name="7", score=7, version=0, extra=None)]
    assert sum(b.num_rows for b in r.scan()) == 100
