"""Binary columns <-> base64 text, a column at a time, equal to Python's base64 value by value."""
from __future__ import annotations

import base64

import pyarrow as pa
from hypothesis import given, strategies as st

from fluvial.schema.base64_text import b64decode, b64encode

values = st.lists(st.one_of(st.none(), st.binary(max_size=20)), max_size=60)


@given(values, st.integers(0, 5))
def test_round_trip_equals_python_base64(vals, cut):
    arr = pa.array(vals, pa.binary()).slice(min(cut, len(vals)))  # also sliced arrays
    want = [None if v is None else base64.b64encode(v).decode() for v in vals[min(cut, len(vals)):]]
    text = b64encode(arr)
    assert text.to_pylist() == want
    back, bad = b64decode(text)
    assert back.to_pylist() == vals[min(cut, len(vals)):] and not bad.any()


def test_invalid_texts_are_named():
    texts = ["eA==", "eA=", "e===", "abc$", "", None, "eHk=", "eHl6", "=eHk", "eA=x", "eA==eA=="]
    got, bad = b64decode(pa.array(texts))
    assert got.to_pylist() == [b"x", None, None, None, b"", None, b"xy", b"xyz", None, None, None]
    assert bad.tolist() == [False, True, True, True, False, False, False, False, True, True, True]
