"""Packing a union read's pieces (lake data files, log ranges) into Spark tasks."""
from __future__ import annotations

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed")

from fluvial.spark.source import BucketRange  # noqa: E402
from fluvial.spark.union import ChangelogRange, LakeFiles, Pieces, pack  # noqa: E402


def _flat(parts):
    return [p for x in parts for p in (x.pieces if isinstance(x, Pieces) else (x,))]


def test_every_piece_read_once_in_balanced_tasks():
    files = [LakeFiles(i, b"", None, (f"f{i}",), rows) for i, rows in enumerate([900, 500, 400, 300, 100])]
    ranges = [BucketRange(0, 1000, 1250), BucketRange(1, 700, 760), ChangelogRange(2, 5, 9)]
    parts = pack(files + ranges, max_rows=1000)
    assert len(parts) == 3                                     # ceil(2518 / 1000)
    assert sorted(map(repr, _flat(parts))) == sorted(map(repr, files + ranges))
    loads = [sum(p.rows if isinstance(p, LakeFiles) else p.end - p.start for p in _flat([x])) for x in parts]
    assert max(loads) - min(loads) <= 900                      # no task holds more than the largest piece extra


def test_at_least_one_task_per_bucket_and_nothing_to_pack():
    files = [LakeFiles(i, b"", None, (f"f{i}",), 10) for i in range(4)]
    assert len(pack(files, max_rows=1_000_000, at_least=2)) == 2
    assert pack(files[:1], max_rows=5) == files[:1]            # one piece: left as it is
    assert pack([], max_rows=5) == []
