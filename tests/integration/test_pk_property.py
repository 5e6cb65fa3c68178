"""Property test against a real broker: random upserts, partial updates and deletes over a
small key space, per merge engine; lookups equal a model dict, and replaying the changelog
topic from empty gives the same state."""
from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.client import connect

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("a", pa.string()), pa.field("v", pa.int64())])
_names = itertools.count()

writes = st.lists(st.tuples(st.sampled_from(["upsert", "partial", "delete"]),
                            st.lists(st.tuples(st.integers(0, 6), st.sampled_from(["x", "y", None]),
                                               st.integers(0, 4)), min_size=1, max_size=8)),
                  min_size=1, max_size=8)


def model_write(model: dict, engine: str, kind: str, k: int, a, v: int) -> None:
    if kind == "delete":
        model.pop(k, None)
    elif engine == "first_row":
        model.setdefault(k, {"k": k, "a": a, "v": v})
    elif engine == "versioned":
        if k not in model or v >= model[k]["v"]:
            model[k] = {"k": k, "a": a, "v": v}
    elif kind == "partial":
        model[k] = {**model.get(k, {"k": k, "a": None, "v": None}), "v": v}
    else:
        model[k] = {"k": k, "a": a, "v": v}


@pytest.mark.parametrize("engine", ["last_row", "first_row", "versioned"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=writes)
def test_broker_state_and_changelog_follow_the_model(broker, engine, ops):
    name = f"prop-{engine}-{next(_names)}"
    options = {"merge_engine": engine, "version_column": "v"} if engine == "versioned" else {"merge_engine": engine}
    model: dict = {}
    with connect(broker.flight_url) as client:
        t = client.create_table(name, SCHEMA, buckets=2, primary_key=["k"], **options)
        for kind, rows in ops:
            if engine != "last_row":
                kind = "upsert"
            if kind == "delete":
                t.delete(pa.table({"k": pa.array([r[0] for r in rows], pa.int64())}))
            elif kind == "partial":
                t.upsert(pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                                   "v": pa.array([r[2] for r in rows], pa.int64())}), columns=["k", "v"])
            else:
                t.upsert(pa.Table.from_pylist([{"k": k, "a": a, "v": v} for k, a, v in rows], schema=SCHEMA))
            for k, a, v in rows:
                model_write(model, engine, kind, k, a, v)
        found = t.lookup(pa.table({"k": pa.array(range(7), pa.int64())})).to_pylist()
        assert {r["k"]: r for r in found} == model
        log = client.table(f"{name}.changelog").scan(columns=["_bucket", "_offset", "_change", "k", "a", "v"]).to_arrow()
        replayed: dict = {}
        for r in sorted(log.to_pylist(), key=lambda r: (r["_bucket"], r["_offset"])):
            row = {"k": r["k"], "a": r["a"], "v": r["v"]}
            if r["_change"] in (1, 3):
                replayed[r["k"]] = row
            elif r["_change"] == 4:
                assert replayed.pop(r["k"]) == row
            else:
                assert replayed[r["k"]] == row
        assert replayed == model
        client.drop_table(name)
