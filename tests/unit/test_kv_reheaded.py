"""Kafka keys of lookups derived from storage keys: the header swap over whole arrays."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.kv.pk_tables import reheaded


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=12), max_size=40), st.integers(0, 5), st.integers(0, 5))
def test_reheaded_equals_the_per_value_swap(values, start, header_len):
    arr = pa.array(values, pa.binary()).slice(min(start, len(values)))
    header = bytes(range(1, header_len + 1))
    assert reheaded(arr, 1, header).to_pylist() == [header + v[1:] for v in arr.to_pylist()]
