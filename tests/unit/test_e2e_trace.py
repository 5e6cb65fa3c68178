"""benchmarks/e2e_trace.py follows each record through the broker's steps by its offset."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.e2e_trace import STAGES, attribute

MS = 1_000_000  # ns


def _events(rows: list[tuple[int, int, int]]) -> np.ndarray:
    return np.array([(a * MS, b * MS, offset) for a, b, offset in rows], dtype=np.int64)


# Two appends (offsets 0-4 and 5-9); the first flush covers only the first, the second flush
# starts after a slow fsync of the first (records 5-9 waited behind it).
EVENTS = {
    "append": _events([(9, 10, 5), (19, 20, 10)]),
    "flush": _events([(12, 12, 5), (40, 40, 10)]),
    "fsync": _events([(13, 39, 5), (41, 42, 10)]),
    "durable": _events([(39.5, 39.5, 5), (43, 43, 10)]),
    "fetch": _events([(44, 45, 10)]),
}


def test_each_record_is_attributed_to_the_first_step_that_covers_its_offset() -> None:
    rows = np.array([[5 * MS, 17 * MS], [46 * MS, 47 * MS], [3, 7]], dtype=np.int64)
    parts = attribute(rows, EVENTS)
    assert parts.shape == (len(STAGES), 2)
    # Offset 3: appended at 10, flushed from 12, fsync 13-39, durable 39.5, fetched by 45 (the
    # only fetch that returned it), received 46.
    assert parts[:, 0] == pytest.approx([5, 2, 1, 26, 0.5, 5.5, 1])
    # Offset 7: appended at 20 while the slow fsync ran; its own flush began at 40.
    assert parts[:, 1] == pytest.approx([3, 20, 1, 1, 1, 2, 2])
    # The stages add up to each record's latency.
    assert parts.sum(axis=0) == pytest.approx((rows[1] - rows[0]) / MS)


def test_an_earlier_event_of_a_lower_offset_does_not_cover_a_later_record() -> None:
    # Offset 5 is the first record of the second append: the first flush (log end 5) does not
    # cover it, though it happened after the first append.
    rows = np.array([[18 * MS], [46 * MS], [5]], dtype=np.int64)
    parts = attribute(rows, EVENTS)
    assert parts[1, 0] == pytest.approx(20)  # append (20) -> second flush (40)
