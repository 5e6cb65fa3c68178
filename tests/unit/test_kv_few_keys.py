"""Point-lookup keys encoded one by one are byte for byte the array encoder's."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.kv.row_codec import DATA_PREFIX, KeyLayout

SCHEMA = pa.schema([pa.field("a", pa.int64(), False), pa.field("b", pa.string(), False),
                    pa.field("c", pa.int32(), False), pa.field("d", pa.binary(), False),
                    pa.field("e", pa.int8(), False), pa.field("f", pa.int16(), False)])
ROW = st.fixed_dictionaries({
    "a": st.integers(-2**63, 2**63 - 1), "b": st.text(max_size=200), "c": st.integers(-2**31, 2**31 - 1),
    "d": st.binary(max_size=200), "e": st.integers(-128, 127), "f": st.integers(-2**15, 2**15 - 1)})


@settings(max_examples=150, deadline=None)
@given(st.lists(ROW, min_size=1, max_size=8), st.sampled_from([["a"], ["b", "a"], ["c", "d", "e", "f"]]))
def test_few_keys_equal_the_array_encoding(rows, key):
    layout = KeyLayout(SCHEMA, key)
    data = pa.Table.from_pylist(rows, schema=SCHEMA)
    few = layout._few_keys(data)
    assert few is not None
    assert few.to_pylist() == layout._encode(data, layout.key_schema).to_pylist()
    assert all(k.startswith(DATA_PREFIX) for k in few.to_pylist())


def test_other_types_and_casts_take_the_array_path():
    layout = KeyLayout(SCHEMA, ["a"])
    assert layout._few_keys(pa.table({"a": pa.array([1], pa.int32())})) is None  # cast by the array path
    dated = pa.schema([pa.field("d", pa.date32(), False)])
    assert not KeyLayout(dated, ["d"])._plain_key
