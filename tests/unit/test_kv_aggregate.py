"""KV tablet, `aggregation` engine: every function against a plain model, with and without
retractions, written in random batches; the changelog rebuilds the state; refusals."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.errors import InvalidConfigError, InvalidRecordError
from fluvial.kv import ChangeType, KeyLayout, KvTablet, MergeSpec
from fluvial.kv.change_types import FIRST_HIDDEN

TYPES = {"sum": pa.int64(), "min": pa.int64(), "max": pa.int64(), "count": pa.int64(), "last_value": pa.int64(),
         "last_non_null_value": pa.int64(), "first_value": pa.int64(), "first_non_null_value": pa.int64(),
         "bool_and": pa.bool_(), "bool_or": pa.bool_(), "listagg": pa.string()}


def schema_for(fn: str) -> pa.Schema:
    return pa.schema([pa.field("k", pa.int64(), False), pa.field("v", TYPES[fn])])


def open_tablet(path, fn):
    schema = schema_for(fn)
    spec = MergeSpec.of(schema, ["k"], "aggregation", None, aggregates={"v": fn})
    return KvTablet.open(path, schema, KeyLayout(schema, ["k"]), spec)


def value_strategy(fn):
    if fn in ("bool_and", "bool_or"):
        return st.one_of(st.none(), st.booleans())
    if fn == "listagg":
        return st.one_of(st.none(), st.sampled_from(["a", "b", "c"]))
    return st.one_of(st.none(), st.integers(-50, 50))


def model_apply(model: dict, fn: str, k: int, v, kind: str) -> None:
    """One write to the model: kind is 'add', 'retract' or 'delete'."""
    if kind == "delete":
        model.pop(k, None)
        return
    new = k not in model
    old = model.get(k)
    if fn == "sum":
        sv = None if v is None else (v if kind == "add" else -v)
        out = old if sv is None else (sv if old is None else old + sv)
    elif fn == "count":
        out = (old or 0) + (0 if v is None else (1 if kind == "add" else -1))
    elif fn == "min":
        out = old if v is None else (v if old is None else min(old, v))
    elif fn == "max":
        out = old if v is None else (v if old is None else max(old, v))
    elif fn == "last_value":
        out = v
    elif fn == "last_non_null_value":
        out = old if v is None else v
    elif fn == "first_value":
        out = v if new else old
    elif fn == "first_non_null_value":
        out = v if old is None else old
    elif fn == "bool_and":
        out = old if v is None else (v if old is None else old and v)
    elif fn == "bool_or":
        out = old if v is None else (v if old is None else old or v)
    else:  # listagg
        out = old if v is None else (v if old is None else f"{old},{v}")
    model[k] = out


def write(tablet, ops, offset):
    """ops: [(k, v, kind)] as one batch; returns the changelog rows."""
    schema = tablet.schema
    rows = pa.RecordBatch.from_pylist([{"k": k, "v": v} for k, v, _ in ops], schema=schema)
    deletes = np.array([kind == "delete" for _, _, kind in ops])
    changes = np.array([ChangeType.UPDATE_BEFORE if kind == "retract" else ChangeType.INSERT for _, _, kind in ops],
                       np.int8)
    w = tablet.prepare(rows, deletes=deletes, changes=changes)
    tablet.apply(w, offset + w.changelog.num_rows)
    return w.changelog.to_pylist(), offset + w.changelog.num_rows


def state(tablet) -> dict:
    return {r["k"]: r["v"] for b in tablet.scan() for r in b.to_pylist()}


def check(tmp_path, fn, batches):
    t = open_tablet(tmp_path / "kv", fn)
    model: dict = {}
    replayed: dict = {}
    offset = 0
    for ops in batches:
        log, offset = write(t, ops, offset)
        for k, v, kind in ops:
            model_apply(model, fn, k, v, kind)
        for r in log:
            assert r["_change"] < FIRST_HIDDEN  # the state is the visible row: nothing hidden is logged
            if r["_change"] in (ChangeType.INSERT, ChangeType.UPDATE_AFTER):
                replayed[r["k"]] = r["v"]
            elif r["_change"] == ChangeType.DELETE:
                assert replayed.pop(r["k"]) == r["v"]
            else:
                assert replayed[r["k"]] == r["v"]
        assert state(t) == model
    assert replayed == model
    t.close()


def batches_of(fn, kinds):
    op = st.tuples(st.integers(0, 4), value_strategy(fn), st.sampled_from(kinds))
    return st.lists(st.lists(op, min_size=1, max_size=8), min_size=1, max_size=6)


@pytest.mark.parametrize("fn", sorted(TYPES))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_function_follows_the_model_without_retractions(tmp_path_factory, fn, data):
    batches = data.draw(batches_of(fn, ["add", "add", "add", "delete"]))
    check(tmp_path_factory.mktemp(fn), fn, batches)


@pytest.mark.parametrize("fn", ["sum", "count"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_retractable_function_follows_the_model_with_retractions(tmp_path_factory, fn, data):
    batches = data.draw(batches_of(fn, ["add", "add", "retract", "delete"]))
    check(tmp_path_factory.mktemp(fn), fn, batches)


@pytest.mark.parametrize("fn", sorted(set(TYPES) - {"sum", "count"}))
def test_functions_that_cannot_retract_refuse_retractions(tmp_path, fn):
    t = open_tablet(tmp_path / "kv", fn)
    v = {"bool_and": True, "bool_or": True, "listagg": "a"}.get(fn, 1)
    write(t, [(1, v, "add")], 0)
    with pytest.raises(InvalidRecordError, match=f"'v' \\({fn}\\)") as e:
        write(t, [(2, v, "add"), (1, v, "retract")], 10)
    assert e.value.record_errors[0][0] == 1
    assert state(t) == {1: v}  # nothing of the refused batch


def test_aggregate_definitions_are_checked():
    s = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string()), pa.field("n", pa.int64())])
    with pytest.raises(InvalidConfigError, match="needs a numeric column"):
        MergeSpec.of(s, ["k"], "aggregation", None, aggregates={"v": "sum"})
    with pytest.raises(InvalidConfigError, match="Unknown aggregate function 'median'"):
        MergeSpec.of(s, ["k"], "aggregation", None, aggregates={"n": "median"})
    with pytest.raises(InvalidConfigError, match="cannot be aggregated"):
        MergeSpec.of(s, ["k"], "aggregation", None, aggregates={"k": "sum"})
    spec = MergeSpec.of(s, ["k"], "aggregation", None, aggregates={"n": "SUM"})
    assert dict(spec.aggregates) == {"v": "last_non_null_value", "n": "sum"}


def test_several_columns_fold_together_and_replay(tmp_path):
    s = pa.schema([pa.field("k", pa.string(), False), pa.field("total", pa.float64()), pa.field("n", pa.int32()),
                   pa.field("tags", pa.string())])
    spec = MergeSpec.of(s, ["k"], "aggregation", None, aggregates={"total": "sum", "n": "count", "tags": "listagg"})
    t = KvTablet.open(tmp_path / "kv", s, KeyLayout(s, ["k"]), spec)
    rows = pa.RecordBatch.from_pylist([{"k": "a", "total": 1.5, "n": 7, "tags": "x"},
                                       {"k": "b", "total": 2.0, "n": None, "tags": None},
                                       {"k": "a", "total": 3.0, "n": 1, "tags": "y"}], schema=s)
    w = t.prepare(rows)
    assert [(r["_change"], r["k"]) for r in w.changelog.to_pylist()] == [(ChangeType.INSERT, "b"),
                                                                        (ChangeType.INSERT, "a")]
    t.apply(w, 2)
    assert {r["k"]: (r["total"], r["n"], r["tags"]) for b in t.scan() for r in b.to_pylist()} == {
        "a": (4.5, 2, "x,y"), "b": (2.0, 0, None)}
