"""Merge engines on a reordered changelog: write throughput of `retract` and `aggregation`
against `last_row` on the same data, and the RocksDB bytes each keeps per key.

The data is a join's changelog as in the out-of-orderness seed: `--keys` rows (id, level,
amount) are inserted, then rows move to other levels (-U old, +U new) until `--changes`
changes exist. It is split by `level` across `--writers` writers (a shuffle by a non-key
column: each writer keeps its rows' order) that write at the same time, each through its
own native client, in batches of `--batch` rows with the change type in the `_change`
column. The same changes go to three tables of one broker process (flush policy `ack`):
`last_row` (a retraction deletes the key: the seed's wrong result), `retract` (the list
of live rows per key; whole-row identity) and `aggregation` (level: sum, amount: count,
both retractable); each run starts with another engine. After each run the broker stops and the KV tablets' RocksDB is read
to count the bytes of keys and values per key. Loopback, wall clock, client and broker
on one machine; the median of `--runs` runs. Saves benchmarks/results/pk_retract.json.

    python -m benchmarks.bench_pk_retract [--changes 1000000] [--keys 100000] [--writers 4] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import fluvial.client as fc
from benchmarks import machine
from tests.support.broker_process import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "pk_retract.json"
SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("level", pa.int64()), pa.field("amount", pa.int64())])
LEVELS = 64
ENGINES = {
    "last_row": {},
    "retract": {"merge_engine": "retract"},
    "aggregation": {"merge_engine": "aggregation", "aggregates": {"level": "sum", "amount": "count"}},
}


def changelog(changes: int, keys: int, seed: int = 7) -> pa.Table:
    """The sequential changelog: an +I per key, then moves (-U old row, +U new row) of random keys."""
    rng = np.random.default_rng(seed)
    moves = max(0, (changes - keys) // 2)
    ids = np.arange(keys, dtype=np.int64)
    level = rng.integers(0, LEVELS, keys)
    kinds, out_ids, out_levels = [np.full(keys, "+I")], [ids], [level.copy()]
    moved = rng.integers(0, keys, moves)
    new_levels = rng.integers(0, LEVELS, moves)
    # A key's level before each move: the level its previous move (or its insert) left.
    order = np.argsort(moved, kind="stable")
    sorted_ids = moved[order]
    prev = np.empty(moves, np.int64)
    first = np.ones(moves, bool)
    first[1:] = sorted_ids[1:] != sorted_ids[:-1]
    prev_sorted = np.empty(moves, np.int64)
    prev_sorted[first] = level[sorted_ids[first]]
    shifted = new_levels[order]
    prev_sorted[~first] = shifted[np.flatnonzero(~first) - 1]
    prev[order] = prev_sorted
    # Interleave -U old, +U new per move.
    kinds.append(np.tile(np.array(["-U", "+U"]), moves))
    out_ids.append(np.repeat(moved, 2))
    out_levels.append(np.column_stack([prev, new_levels]).ravel())
    kinds_a = np.concatenate(kinds)
    ids_a = np.concatenate(out_ids)
    lv = np.concatenate(out_levels)
    return pa.table({"_change": pa.array(kinds_a), "id": ids_a, "level": lv, "amount": lv * 10})


def split(log: pa.Table, writers: int) -> list[pa.Table]:
    """Each writer's rows (shuffled by level), in changelog order."""
    w = log.column("level").to_numpy() % writers
    return [log.take(pa.array(np.flatnonzero(w == i))) for i in range(writers)]


def write_all(url: str, table: str, parts: list[pa.Table], batch: int) -> float:
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(parts) + 1)

    def run(part: pa.Table) -> None:
        try:
            with fc.connect(url) as client:
                t = client.table(table)
                barrier.wait()
                for start in range(0, part.num_rows, batch):
                    t.upsert(part.slice(start, batch))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in parts]
    for th in threads:
        th.start()
    barrier.wait()
    start = time.perf_counter()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed


def state_bytes(kv_dir: Path, table: str) -> dict:
    """Keys and bytes of the table's RocksDB (every bucket): visible rows (`d`) and retract lists (`s`)."""
    from rocksdict import AccessType, Options, Rdict
    rows = state = keys = 0
    for path in sorted(kv_dir.glob(f"{table}-*")):
        db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
        it = db.iter()
        it.seek_to_first()
        while it.valid():
            k, v = it.key(), it.value()
            if k[:1] == b"d":
                rows += len(k) + len(v)
                keys += 1
            elif k[:1] == b"s":
                state += len(k) + len(v)
            it.next()
        del it
        db.close()
    return {"keys": keys, "row_bytes": rows, "state_bytes": state,
            "bytes_per_key": round((rows + state) / keys, 1) if keys else 0.0}


class _StateWatch:
    """Polls a retract table's figures while it is written: the most live rows it kept."""

    def __init__(self, url: str, table: str, every_s: float = 0.5):
        self.peak = {"rows": 0, "keys": 0, "keys_with_2_or_more_rows": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, table, every_s), daemon=True)
        self._thread.start()

    def _run(self, url: str, table: str, every_s: float) -> None:
        with fc.connect(url) as client:
            t = client.table(table)
            while not self._stop.wait(every_s):
                r = t.kv_stats()["retract"]
                hist = r["rows_per_key_histogram"]
                if r["rows"] - r["keys"] >= self.peak["rows"] - self.peak["keys"]:
                    self.peak = {"rows": r["rows"], "keys": r["keys"],
                                 "keys_with_2_or_more_rows": sum(v for k, v in hist.items() if k != "1")}

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(10)
        return self.peak


def one_run(args, log: pa.Table, parts: list[pa.Table], rotate: int = 0) -> dict:
    out = {}
    names = list(ENGINES)
    # Each run starts with another engine: a load change on a shared machine does not
    # always hit the same one.
    names = names[rotate % len(names):] + names[:rotate % len(names)]
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data", "--flush-policy", "ack").start()
        try:
            with fc.connect(broker.flight_url) as client:
                for engine, options in ENGINES.items():
                    client.create_table(f"t_{engine}", SCHEMA, buckets=args.buckets, kafka_format="avro",
                                        primary_key=["id"], **options)
            for engine in names:
                watch = _StateWatch(broker.flight_url, f"t_{engine}") if engine == "retract" else None
                seconds = write_all(broker.flight_url, f"t_{engine}", parts, args.batch)
                out[engine] = {"seconds": round(seconds, 3), "rows_per_s": round(log.num_rows / seconds)}
                if watch is not None:
                    out[engine]["peak"] = watch.stop()
            with fc.connect(broker.flight_url) as client:
                out["retract"]["kv_stats"] = client.table("t_retract").kv_stats()["retract"]
        finally:
            broker.stop()
        for engine in ENGINES:
            out[engine]["state"] = state_bytes(Path(tmp) / "data" / "kv", f"t_{engine}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--buckets", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    log = changelog(args.changes, args.keys)
    parts = split(log, args.writers)
    loads = [round(os.getloadavg()[0], 2)]
    runs = []
    for i in range(args.runs):
        runs.append(one_run(args, log, parts, i))
        loads.append(round(os.getloadavg()[0], 2))
        print(f"run {i + 1}: " + ", ".join(f"{e} {runs[-1][e]['rows_per_s']} rows/s" for e in ENGINES), flush=True)
    engines = {}
    for engine in ENGINES:
        rates = [r[engine]["rows_per_s"] for r in runs]
        engines[engine] = {"rows_per_s": round(statistics.median(rates)), "runs_rows_per_s": rates,
                           "state": runs[-1][engine]["state"]}
    base = engines["last_row"]["rows_per_s"]
    ratios = {e: round(statistics.median(r[e]["rows_per_s"] / r["last_row"]["rows_per_s"] for r in runs), 3)
              for e in ("retract", "aggregation")}
    out = {
        "benchmark": "pk_retract",
        "changes": log.num_rows,
        "keys": args.keys,
        "writers": args.writers,
        "batch_rows": args.batch,
        "buckets": args.buckets,
        "runs": args.runs,
        "engines": engines,
        "retract_vs_last_row": round(engines["retract"]["rows_per_s"] / base, 3),
        "aggregation_vs_last_row": round(engines["aggregation"]["rows_per_s"] / base, 3),
        # Per run, then the median: the ratio of rates measured minutes apart, not hours.
        "median_run_ratio_vs_last_row": ratios,
        "last_row_keys_lost": args.keys - runs[-1]["last_row"]["state"]["keys"],
        "retract_state": runs[-1]["retract"]["kv_stats"],
        # While the writers run: the most rows kept beyond one per key (ADDs waiting for
        # their RETRACT), polled every half second.
        "retract_peak_state": max((r["retract"]["peak"] for r in runs), key=lambda p: p["rows"] - p["keys"]),
        "flush_policy": "ack",
        # The machine may be shared: the load average says how much CPU the runs had.
        "load_average_1m": loads,
        "machine": machine.describe(),
    }
    print(json.dumps({k: v for k, v in out.items() if k != "machine"}, indent=1))
    if not args.no_save:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
