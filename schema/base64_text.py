"""Binary columns <-> base64 text (RFC 4648, padded) a whole column at a time: how JSON values
carry bytes (JSON Schema `contentEncoding: base64`). No per-value Python loop."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_ALPHABET = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8)
_VALUE = np.full(256, 255, np.uint8)
_VALUE[_ALPHABET] = np.arange(64, dtype=np.uint8)
_VALUE[ord("=")] = 0


def _offsets(arr: pa.Array) -> np.ndarray:
    dtype = np.dtype(np.int32 if arr.type in (pa.string(), pa.binary()) else np.int64)
    return np.frombuffer(arr.buffers()[1], dtype, len(arr) + 1, arr.offset * dtype.itemsize)


def b64encode(arr: pa.Array) -> pa.Array:
    """Binary values as standard base64 text (padded)."""
    arr = arr.cast(pa.binary())
    if len(arr) == 0:
        return pa.array([], pa.string())
    off = _offsets(arr).astype(np.int64)
    data = np.frombuffer(arr.buffers()[2], np.uint8) if arr.buffers()[2] is not None else np.zeros(0, np.uint8)
    lengths = np.diff(off)
    if arr.null_count:
        lengths = np.where(arr.is_null().to_numpy(zero_copy_only=False), 0, lengths)
    groups = (lengths + 2) // 3
    padded_len = groups * 3
    total = int(padded_len.sum())
    starts = np.concatenate([[0], np.cumsum(padded_len)[:-1]])
    # each value's bytes, zero-padded to whole groups of three
    buf = np.zeros(total, np.uint8)
    src = np.repeat(off[:-1], lengths) + (np.arange(int(lengths.sum())) - np.repeat(np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths))
    dst = np.repeat(starts, lengths) + (np.arange(int(lengths.sum())) - np.repeat(np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths))
    buf[dst] = data[src]
    g = buf.reshape(-1, 3).astype(np.uint32)
    n = (g[:, 0] << 16) | (g[:, 1] << 8) | g[:, 2]
    chars = np.stack([(n >> 18) & 63, (n >> 12) & 63, (n >> 6) & 63, n & 63], axis=1).astype(np.uint8)
    out = _ALPHABET[chars].reshape(-1)
    # padding: the last group of a value holding 1 or 2 bytes ends with "==" or "="
    rem = lengths % 3
    last = (starts // 3 + groups - 1) * 4
    one = rem == 1
    two = rem == 2
    out[last[one] + 2] = ord("=")
    out[last[one] + 3] = ord("=")
    out[last[two] + 3] = ord("=")
    text_off = np.concatenate([[0], np.cumsum(groups * 4)]).astype(np.int32)
    mask = arr.is_null() if arr.null_count else None
    res = pa.Array.from_buffers(pa.string(), len(arr), [None, pa.py_buffer(text_off), pa.py_buffer(out.tobytes())])
    return res if mask is None else pc.if_else(mask, pa.scalar(None, pa.string()), res)


def b64decode(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Base64 texts as binary values (invalid ones as null), and which texts are not base64."""
    arr = arr.cast(pa.string())
    if len(arr) == 0:
        return pa.array([], pa.binary()), np.zeros(0, bool)
    off = _offsets(arr).astype(np.int64)
    data = np.frombuffer(arr.buffers()[2], np.uint8)[off[0]:off[-1]] if arr.buffers()[2] is not None else np.zeros(0, np.uint8)
    off = off - off[0]
    lengths = np.diff(off)
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    bad = valid & (lengths % 4 != 0)
    vals = _VALUE[data]
    bad_char = vals == 255
    if bad_char.any():
        which = np.searchsorted(off, np.flatnonzero(bad_char), side="right") - 1
        bad[which] = True
    # '=' only in the last two places of a value
    eq = data == ord("=")
    if eq.any():
        which = np.searchsorted(off, np.flatnonzero(eq), side="right") - 1
        from_end = off[which + 1] - np.flatnonzero(eq)
        wrong = from_end > 2
        bad[which[wrong]] = True
        # "=X" at the end is wrong too
        two = from_end == 2
        bad[which[two][data[off[which[two] + 1] - 1] != ord("=")]] = True
    ok_len = np.where(bad | ~valid, 0, lengths)
    # decode every complete group of the good values
    keep_chars = np.repeat(~(bad | ~valid), lengths)
    chars = vals[keep_chars].astype(np.uint32).reshape(-1, 4)
    n = (chars[:, 0] << 18) | (chars[:, 1] << 12) | (chars[:, 2] << 6) | chars[:, 3]
    raw = np.stack([(n >> 16) & 255, (n >> 8) & 255, n & 255], axis=1).astype(np.uint8).reshape(-1)
    pads = np.zeros(len(arr), np.int64)
    has = ok_len > 0
    ends = off[1:] - 1
    pads[has] = (data[ends[has]] == ord("=")).astype(np.int64) + (data[ends[has] - 1] == ord("=")).astype(np.int64)
    out_len = ok_len // 4 * 3 - pads
    full_len = ok_len // 4 * 3
    starts = np.concatenate([[0], np.cumsum(full_len)[:-1]])
    idx = np.repeat(starts, out_len) + (np.arange(int(out_len.sum())) - np.repeat(np.concatenate([[0], np.cumsum(out_len)[:-1]]), out_len))
    body = raw[idx]
    boff = np.concatenate([[0], np.cumsum(out_len)]).astype(np.int32)
    res = pa.Array.from_buffers(pa.binary(), len(arr), [None, pa.py_buffer(boff), pa.py_buffer(body.tobytes())])
    nulls = ~valid | bad
    if nulls.any():
        res = pc.if_else(pa.array(nulls), pa.scalar(None, pa.binary()), res)
    return res, bad
