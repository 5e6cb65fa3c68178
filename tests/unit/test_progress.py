"""Progress of long work: the CLI bar, the broker's progress log lines, and where they are used."""
from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pytest

from fluvial.broker.table_copy import rechunk
from fluvial.kv import KeyLayout, KvTablet, MergeSpec, SnapshotStore
from fluvial.progress import ProgressLog, cli_progress
from fluvial.tiering.kv_snapshots import RemoteKvSnapshots
from fluvial.tiering.object_store import open_object_store

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("score", pa.int64())])


def test_progress_log_reports_counts_percent_rate_and_end(caplog):
    log = logging.getLogger("test.progress")
    p = ProgressLog(log, "restoring things", 200, "items", every_s=0.0)
    with caplog.at_level(logging.INFO, "test.progress"):
        p.update(50)
        p.advance(50)
        p.finish("all there")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("restoring things: 50/200 items (25%)")
    assert lines[1].startswith("restoring things: 100/200 items (50%)") and "s left" in lines[1]
    assert lines[2].startswith("restoring things: done, 100/200 items") and lines[2].endswith("(all there)")


def test_progress_log_is_quiet_between_intervals(caplog):
    p = ProgressLog(logging.getLogger("test.quiet"), "work", None, every_s=3600)
    with caplog.at_level(logging.INFO, "test.quiet"):
        for i in range(1000):
            p.update(i)
    assert caplog.records == []


def test_cli_progress_draws_a_bar_on_stderr_when_asked(capsys):
    with cli_progress("copy a -> b", 1000, "rows", enabled=True) as bar:
        bar.advance(400)
        bar.advance(600)
    err = capsys.readouterr().err
    assert "copy a -> b" in err and "1000/1000" in err and "100%" in err


def test_cli_progress_stays_silent_when_not_a_terminal(capsys):
    with cli_progress("copy", 10) as bar:  # pytest's stderr is not a terminal
        bar.advance(10)
    assert capsys.readouterr().err == ""


def test_rechunk_keeps_rows_and_order():
    batches = [pa.record_batch({"x": pa.array(range(i * 7, i * 7 + 7))}) for i in range(20)]
    out = list(rechunk(batches, rows=30))
    assert [b.num_rows for b in out] == [30, 30, 30, 30, 20]
    assert pa.Table.from_batches(out)["x"].to_pylist() == list(range(140))
    big = [pa.record_batch({"x": pa.array(range(95))})]
    assert [b.num_rows for b in rechunk(big, rows=30)] == [30, 30, 30, 5]


def test_kv_snapshot_restore_logs_its_progress(tmp_path, caplog):
    store = open_object_store((tmp_path / "store").as_uri())
    tablet = KvTablet.open(tmp_path / "kv", SCHEMA, KeyLayout(SCHEMA, ["id"]), MergeSpec.of(SCHEMA, ["id"], None, None))
    rows = pa.RecordBatch.from_pydict({"id": pa.array(range(5000), pa.int64()),
                                       "score": pa.array(np.ones(5000, np.int64))}, schema=SCHEMA)
    tablet.apply(tablet.prepare(rows), 10)
    local = SnapshotStore(tmp_path / "snaps")
    remote = RemoteKvSnapshots(store, "kv/t/0", retain=2)
    info = local.take(tablet)
    view, offset = tablet.snapshot()
    snap = remote.upload(info.path / "db", offset, tablet.scan(view=view), tablet.schema, tmp_path / "scratch")
    tablet.close()
    with caplog.at_level(logging.INFO, "fluvial.tiering.kv_snapshots"):
        remote.download(snap, tmp_path / "restored")
    total = sum(size for _, size in snap.files)
    done = [r.getMessage() for r in caplog.records if "restoring KV snapshot" in r.getMessage()]
    assert done and f"done, {total:,}/{total:,} bytes (100%)" in done[-1]
    store.close()


@pytest.mark.parametrize("n", [0])
def test_progress_log_without_total(caplog, n):
    p = ProgressLog(logging.getLogger("test.open"), "scanning", None, "records", every_s=0)
    with caplog.at_level(logging.INFO, "test.open"):
        p.update(12)
    assert caplog.records[0].getMessage().startswith("scanning: 12 records in ")
