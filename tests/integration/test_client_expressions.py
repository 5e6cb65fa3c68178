"""Scan filters as pyarrow.compute Expressions: the same rows as pyarrow.dataset, the exact
parts pushed down to the broker (batches skipped), bad filters refused before any request."""
from __future__ import annotations

import datetime as dt
import math
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fluvial.client as fc

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("i", pa.int32()), ("f", pa.float64()),
                    ("s", pa.string()), ("b", pa.bool_())])
UTC = dt.timezone.utc
BASE = dt.datetime(2026, 3, 1, tzinfo=UTC)
# Property tables also hold temporal columns (Avro values keep their types).
TEMPORAL = pa.schema([*SCHEMA, ("t", pa.timestamp("ms", tz="UTC")), ("d", pa.date32())])


@pytest.fixture(scope="module")
def client(broker):
    with fc.connect(broker.flight_url) as c:
        yield c


# -- random tables and expressions -------------------------------------------------------------

ints = st.one_of(st.none(), st.integers(-50, 50))
floats = st.one_of(st.none(), st.sampled_from([math.nan, -1.5, 0.0, 2.5]), st.floats(-60, 60, allow_nan=False))
texts = st.one_of(st.none(), st.sampled_from(["", "a", "ab", "b", "zz"]))
bools = st.one_of(st.none(), st.booleans())
times = st.one_of(st.none(), st.integers(0, 40).map(lambda k: BASE + dt.timedelta(milliseconds=250 * k)))
days = st.one_of(st.none(), st.integers(0, 20).map(lambda k: dt.date(2026, 3, 1) + dt.timedelta(days=k)))


@st.composite
def tables(draw) -> pa.Table:
    n = draw(st.integers(0, 60))
    return pa.table({"id": list(range(n)), "i": pa.array(draw(st.lists(ints, min_size=n, max_size=n)), pa.int32()),
                     "f": pa.array(draw(st.lists(floats, min_size=n, max_size=n)), pa.float64()),
                     "s": draw(st.lists(texts, min_size=n, max_size=n)),
                     "b": pa.array(draw(st.lists(bools, min_size=n, max_size=n)), pa.bool_()),
                     "t": pa.array(draw(st.lists(times, min_size=n, max_size=n)), pa.timestamp("ms", tz="UTC")),
                     "d": pa.array(draw(st.lists(days, min_size=n, max_size=n)), pa.date32())}, schema=TEMPORAL)


CMP = [lambda a, b: a == b, lambda a, b: a != b, lambda a, b: a < b, lambda a, b: a <= b,
       lambda a, b: a > b, lambda a, b: a >= b]


def literal_for(column: str):
    if column == "i":  # also values an int32 cannot hold and fractions: those stay with the client
        return st.one_of(st.integers(-60, 60), st.sampled_from([2**40, -2**40, 2.5, -0.5]))
    if column == "f":
        return st.one_of(st.floats(-60, 60, allow_nan=False), st.just(math.nan), st.integers(-5, 5))
    if column == "s":
        return st.sampled_from(["", "a", "ab", "b", "zz", "c"])
    if column == "t":  # also sub-millisecond instants, which no stored value equals
        return st.integers(-2, 42).flatmap(lambda k: st.sampled_from([0, 1, 500]).map(
            lambda us: BASE + dt.timedelta(milliseconds=250 * k, microseconds=us)))
    if column == "d":
        return st.integers(-2, 22).map(lambda k: dt.date(2026, 3, 1) + dt.timedelta(days=k))
    return st.booleans()


@st.composite
def atoms(draw) -> pc.Expression:
    column = draw(st.sampled_from(["i", "f", "s", "b", "t", "d"]))
    field = pc.field(column)
    kind = draw(st.sampled_from(["cmp", "cmp_left", "isin", "is_null", "is_valid", "field_field", "bool"]))
    if kind == "cmp":
        return draw(st.sampled_from(CMP))(field, draw(literal_for(column)))
    if kind == "cmp_left":
        return draw(st.sampled_from(CMP))(pc.scalar(draw(literal_for(column))), field)
    if kind == "isin":
        values = draw(st.lists(st.one_of(literal_for(column), st.none()) if column != "i" else
                               st.one_of(st.integers(-60, 60), st.none()), max_size=4))
        typed = pa.array(values, TEMPORAL.field(column).type)
        return field.isin(typed)
    if kind == "is_null":
        return field.is_null(nan_is_null=draw(st.booleans()))
    if kind == "is_valid":
        return field.is_valid()
    if kind == "field_field":
        return draw(st.sampled_from(CMP))(pc.field("i"), pc.field("f"))
    return pc.field("b")


def expressions():
    return st.recursive(atoms(), lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda p: p[0] & p[1]),
        st.tuples(inner, inner).map(lambda p: p[0] | p[1]),
        inner.map(lambda e: ~e)), max_leaves=5)


def ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=tables(), exprs=st.lists(expressions(), min_size=1, max_size=6), batch_rows=st.integers(1, 25))
def test_random_expressions_give_pyarrow_datasets_rows(client, data, exprs, batch_rows):
    t = client.create_table(f"expr-{uuid.uuid4().hex[:10]}", TEMPORAL, buckets=2, kafka_format="avro")
    try:
        for lo in range(0, data.num_rows, batch_rows):  # several stored batches: statistics can skip
            t.append(data.slice(lo, batch_rows))
        dataset = ds.dataset(data)
        for expr in exprs:
            want = ids(dataset.to_table(filter=expr))
            scan = t.scan(columns=["id"], filter=expr)
            assert ids(scan.to_arrow()) == want, (expr, scan.filter, scan.client_filter)
            # and mixed with a tuple filter, AND-ed
            scan = t.scan(columns=["id", "s"], filter=[("id", ">=", 3), expr])
            assert ids(scan.to_arrow()) == ids(dataset.to_table(filter=(pc.field("id") >= 3) & expr)), expr
    finally:
        client.drop_table(t.name)


# -- what is pushed down ------------------------------------------------------------------------

def test_pushed_expressions_skip_batches_as_tuples_do(client, topic_name):
    t = client.create_table(topic_name, SCHEMA, buckets=1)
    for k in range(10):  # ten stored batches, scores rising: statistics tell them apart
        rows = range(k * 100, k * 100 + 100)
        t.append(pa.table({"id": list(rows), "i": pa.array([r // 10 for r in rows], pa.int32()),
                           "f": [r / 7 for r in rows], "s": [f"s{r % 13}" for r in rows],
                           "b": [r % 2 == 0 for r in rows]}, schema=SCHEMA))
    expr = (pc.field("i") >= 85) & pc.field("s").isin(["s1", "s2"]) & pc.field("b").is_valid() & pc.field("b")
    tuples = [("i", ">=", 85), ("s", "in", ["s1", "s2"]), ("b", "not_null", None), ("b", "=", True)]
    by_expr = t.scan(columns=["id"], filter=expr)
    by_tuple = t.scan(columns=["id"], filter=tuples)
    assert by_expr.filter == [list(x) for x in tuples] and by_expr.client_filter is None
    got, want = by_expr.to_arrow(), by_tuple.to_arrow()
    assert got.equals(want) and got.num_rows > 0
    assert by_expr.stats.batches_skipped == by_tuple.stats.batches_skipped == 8
    assert by_expr.stats.bytes_sent == by_tuple.stats.bytes_sent
    # A disjunction is not pushed: every batch is read and sent, the client filters.
    either = t.scan(columns=["id"], filter=(pc.field("i") >= 85) | (pc.field("i") < 0))
    assert either.filter == [] and either.client_filter is not None
    assert either.to_arrow().equals(want.slice(0, 0)) is False
    assert either.stats.batches_skipped == 0 and either.stats.bytes_sent > by_expr.stats.bytes_sent
    # Partly pushed: the exact condition goes to the broker, the rest stays; columns the
    # client needs for it are read but not returned.
    part = t.scan(columns=["id"], filter=(pc.field("i") >= 85) & (pc.field("f") > pc.field("i")))
    assert part.filter == [["i", ">=", 85]] and part.columns == ["id", "f", "i"]
    assert part.to_arrow().column_names == ["id"] and part.stats.batches_skipped == 8
    # _bucket is not stored: the broker cannot filter on it, the client can
    one = t.scan(columns=["id"], filter=(pc.field("_bucket") == 0) & (pc.field("i") >= 85))
    assert one.filter == [["i", ">=", 85]] and one.to_arrow().equals(t.scan(columns=["id"], filter=[("i", ">=", 85)]).to_arrow())


@pytest.mark.parametrize("expr,pushed", [
    (pc.field("i") > 5, [["i", ">", 5]]),
    (pc.scalar(5) < pc.field("i"), [["i", ">", 5]]),
    (~(pc.field("i") > 5), [["i", "<=", 5]]),
    (~(pc.field("f") > 5), None),                      # not(NaN > 5) holds, NaN <= 5 does not
    (pc.field("i") > 2.5, None),                       # no int32 equals 2.5: pyarrow compares as double
    (pc.field("i") == 2**40, None),                    # out of int32's range
    (pc.field("i").isin([1, 2]), [["i", "in", [1, 2]]]),
    (pc.field("i").isin(pa.array([1, None], pa.int32())), None),  # isin matches null rows then
    (~pc.field("i").isin([1]), None),                  # keeps null rows; the broker's `not in` does not
    (pc.field("f").is_null(), [["f", "is_null", None]]),
    (pc.field("f").is_null(nan_is_null=True), None),
    (~pc.field("s").is_null(), [["s", "not_null", None]]),
    (pc.field("s").is_valid(), [["s", "not_null", None]]),
    (~pc.field("b"), [["b", "=", False]]),
    (pc.field("_offset") >= 10, [["_offset", ">=", 10]]),
    (pc.field("_bucket") == 0, None),
])
def test_which_conditions_are_pushed(client, topic_name, expr, pushed):
    t = client.create_table(topic_name, SCHEMA)
    scan = t.scan(filter=expr)
    if pushed is None:
        assert scan.client_filter is not None
    else:
        assert scan.filter == pushed and scan.client_filter is None


# -- bad filters: clear errors, nothing sent -------------------------------------------------------

def test_bad_filters_are_refused_before_any_request(client, topic_name):
    t = client.create_table(topic_name, SCHEMA)
    # The same table through a client whose broker is unreachable: any request would fail
    # with BrokerUnavailableError, so these errors come from the client alone.
    offline = fc.Table(fc.connect("grpc://127.0.0.1:1"), t.info)
    with pytest.raises(fc.BrokerUnavailableError):
        offline.scan(filter=pc.field("i") > 1).to_arrow()  # a good filter does reach for the broker
    cases = [
        ("i > 5", TypeError, r"not a string .* pc\.field\('score'\) > 5"),
        (5, TypeError, "a scan filter is a pyarrow.compute Expression"),
        ([("i", ">", 1), "s = 'a'"], TypeError, "the list holds str"),
        (pc.field("price") > 1, ValueError, r"no column 'price'; its columns are \['id', 'i', 'f', 's', 'b'\]"),
        ((pc.field("i") > 1) | (pc.field("nope") == "x"), ValueError, "no column 'nope'"),
        (pc.field("s") > 5, TypeError, "does not fit the columns"),
        (pc.field("i") + 1, TypeError, "must evaluate to bool"),
        (pc.field("i").isin(["x"]), TypeError, "does not fit the columns"),
        ([("price", ">", 1)], ValueError, "no column 'price'"),
        ([("s", "like", "a%")], ValueError, "unknown filter operator 'like'"),
        ([("i", "=", "one")], ValueError, "does not fit column 'i'"),
        ([("i", ">")], TypeError, r"a filter tuple is \(column, op, value\)"),
        ([("_bucket", "=", 0)], ValueError, "_bucket cannot be filtered on"),
    ]
    for bad, kind, message in cases:
        with pytest.raises(kind, match=message) as info:
            offline.scan(columns=["id"], filter=bad)
        assert isinstance(info.value, fc.FluvialError), bad
    # The typed classes keep the table API's error kinds.
    with pytest.raises(fc.UnknownColumnError):
        offline.scan(filter=pc.field("price") > 1)
    with pytest.raises(fc.InvalidRequestError):
        offline.scan(filter="i > 5")


# -- union reads of lake tables ----------------------------------------------------------------

from tests.integration.test_union_read import PK_SCHEMA, lake, make_log_table  # noqa: E402,F401 - fixture
from tests.support.lake import sort_rows, tier_log_rows, tier_pk_state  # noqa: E402


def test_union_reads_take_expressions_like_log_reads(client, lake, topic_name):
    catalog, tables, _ = lake
    t = make_log_table(client, topic_name)
    ends = {o.bucket: o.high_watermark for o in t.offsets()}
    tables[t.name] = tier_log_rows(catalog, t, {b: e // 2 for b, e in ends.items()})
    full = t.scan(source="log").to_arrow()
    for expr in [(pc.field("amount") >= 30) & (pc.field("city") != "Oslo"),           # pushed whole
                 (pc.field("qty") < 20) | pc.field("city").is_null(),                   # client only
                 (pc.field("amount") > 100) & (pc.field("qty") > pc.field("amount")),   # both
                 pc.field("city").isin(["Lima", "Pune"]) & ~(pc.field("qty") > 150)]:
        got = t.scan(columns=["id"], filter=expr, source="union")
        rows = got.to_arrow()
        assert rows.column_names == ["id"]
        assert ids(rows) == ids(ds.dataset(full).to_table(filter=expr)), expr
        assert ids(got.to_reader().read_all()) == ids(rows)


def test_primary_key_union_reads_take_expressions(client, lake, topic_name):
    catalog, tables, _ = lake
    t = client.create_table(topic_name, PK_SCHEMA, buckets=2, primary_key=["user", "item"],
                            configs={"fluvial.lake.enable": "true"})
    t.upsert(pa.table({"user": [f"u{i}" for i in range(30)], "item": pa.array(range(30), pa.int32()),
                       "qty": list(range(30)), "note": ["a", "b", None] * 10}, schema=PK_SCHEMA))
    full = t.full_read()
    tables[t.name] = tier_pk_state(catalog, t, full.rows, full.offsets)
    t.upsert(pa.table({"user": ["u1", "u2"], "item": pa.array([1, 2], pa.int32()), "qty": [100, -5],
                       "note": ["z", "a"]}, schema=PK_SCHEMA))
    current = t.scan(source="union").to_arrow()
    expr = ((pc.field("qty") > 10) & (pc.field("note") != "a")) | (pc.field("qty") < 0)
    got = t.scan(columns=["user", "qty"], filter=expr, source="union").to_arrow()
    want = ds.dataset(current).to_table(filter=expr).select(["user", "qty"])
    assert sort_rows(got, ["user"]) == sort_rows(want, ["user"])


def test_temporal_literals_are_pushed_when_exact(client, topic_name):
    t = client.create_table(topic_name, TEMPORAL, kafka_format="avro")
    at = t.scan(filter=pc.field("t") >= BASE)
    assert at.filter == [["t", ">=", BASE]] and at.client_filter is None
    fine = t.scan(filter=pc.field("t") >= BASE + dt.timedelta(microseconds=1))  # finer than the column
    assert fine.filter == [] and fine.client_filter is not None
    day = t.scan(filter=pc.field("d").isin([dt.date(2026, 3, 2)]))
    assert day.filter == [["d", "in", [dt.date(2026, 3, 2)]]]
