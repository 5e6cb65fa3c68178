"""Slow disk work never holds what the event loop waits on.

Appends run on the event loop and take the log tablet's write lock; metadata reads run on
the loop too. A slow fsync of retention (the leader-epoch checkpoint) or a slow SQLite
commit on another thread must not make them wait.
"""
from __future__ import annotations

import threading
import time

from fluvial.broker.log import leader_epoch
from fluvial.broker.metadata import MetadataStore
from tests.unit.test_log_support import meta, open_tablet, records

SLOW_S = 0.6


def test_append_does_not_wait_for_the_retention_checkpoint_fsync(tmp_path, monkeypatch):
    tablet = open_tablet(tmp_path, segment_bytes=4096, retention_ms=-1, retention_bytes=5_000)
    tablet.start_leader_epoch(0)
    for i in range(40):
        tablet.append(records(5, value_size=200, tag=i), meta())
    real_write = leader_epoch.write_text_atomically
    writing = threading.Event()

    def slow_write(path, text, **kwargs):
        writing.set()
        time.sleep(SLOW_S)  # a disk that takes its time to fsync
        real_write(path, text, **kwargs)

    monkeypatch.setattr(leader_epoch, "write_text_atomically", slow_write)
    retention = threading.Thread(target=tablet.enforce_retention, args=(0,))
    retention.start()
    assert writing.wait(5), "retention did not write the leader-epoch checkpoint"
    t0 = time.perf_counter()
    tablet.append(records(5, value_size=200, tag=99), meta())
    waited = time.perf_counter() - t0
    retention.join()
    assert waited < SLOW_S / 3, f"the append waited {waited * 1000:.0f} ms for retention"
    # The checkpoint written is the truncated one: the epoch now starts at the new log start.
    assert leader_epoch.LeaderEpochCache(tablet.leader_epochs.path).entries() == [(0, tablet.log_start_offset)]
    assert tablet.log_start_offset > 0


def test_a_reader_does_not_wait_for_another_threads_commit(tmp_path):
    store = MetadataStore(tmp_path / "metadata.db")
    store.ensure_schema("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT);")
    with store.transaction() as conn:
        conn.execute("INSERT INTO kv VALUES ('a', '1')")
    inside = threading.Event()

    def slow_writer():
        with store.transaction() as conn:
            conn.execute("UPDATE kv SET v = '2' WHERE k = 'a'")
            inside.set()
            time.sleep(SLOW_S)

    writer = threading.Thread(target=slow_writer)
    writer.start()
    assert inside.wait(5)
    t0 = time.perf_counter()
    rows = store.query("SELECT v FROM kv WHERE k = 'a'")
    waited = time.perf_counter() - t0
    writer.join()
    assert waited < SLOW_S / 3, f"the read waited {waited * 1000:.0f} ms for the writer"
    assert rows[0]["v"] == "1"  # the committed state, not the writer's uncommitted one
    assert store.query("SELECT v FROM kv WHERE k = 'a'")[0]["v"] == "2"
    # A second writer queues behind the first instead of failing.
    done = []
    t1 = threading.Thread(target=slow_writer)
    t1.start()
    assert inside.wait(5)
    with store.transaction() as conn:
        conn.execute("INSERT INTO kv VALUES ('b', '3')")
        done.append(True)
    t1.join()
    assert done and store.query("SELECT count(*) AS n FROM kv")[0]["n"] == 2
    store.close()
