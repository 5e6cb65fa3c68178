"""Primary-key tables: upsert throughput, batched and single-key lookups, on a table of 1M keys.

A broker process (flush policy `ack`: every acknowledged write is fsynced) holds a
primary-key table (id int64 key, name string, amount double, updated timestamp). Through
the native client it is filled with upserts of `--batch` rows, each batch 80% new keys and
20% updates of keys already written, until `--keys` keys exist; then batched lookups of
1,000 random keys, then single-key lookups one after another (p50/p99 latency), both over
the client's lookup session; as an extra row, the same 1,000-key batches pipelined
(`Table.lookup_batches`, 2 batches in flight). Loopback, wall clock, client and broker on the same machine.
The same operations are then done straight on rocksdict (the KV tablet's very options, keys
sorted, keys and values encoded beforehand) as the physical reference. Before the lookup
rounds both are flushed to SST files (the broker's by a KV snapshot), outside the clocks. Every figure is
given as the median of rounds (after one warm-up lookup round for both, not counted) with its worst round, beside the load average, with the
CPU time per lookup of the broker and client processes (less sensitive to the load).
Saves benchmarks/results/pk.json; `--profile DIR` samples the broker with py-spy (in the
second lookup round: the first reads cold SST blocks).

    python -m benchmarks.bench_pk [--keys 1000000] [--batch 50000] [--buckets 2] [--warmup 1] [--rounds 5] [--profile DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import fluvial.client as fc
from benchmarks import machine
from tests.support.broker_process import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "pk.json"
SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string()),
                    pa.field("amount", pa.float64()), pa.field("updated", pa.timestamp("ms", tz="UTC"))])


def rows(rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    n = ids.size
    names = pa.array(np.char.add("customer-", (ids % 100_000).astype(str)))
    return pa.table({"id": ids, "name": names, "amount": rng.normal(100, 30, n),
                     "updated": pa.array(np.full(n, int(time.time() * 1000)), pa.timestamp("ms", tz="UTC"))},
                    schema=SCHEMA)


def _profiler(pid: int, out: Path | None):
    """py-spy sampling the broker (collapsed stacks, GIL-holding threads) while a phase runs."""
    if out is None:
        return None
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--format", "raw", "--gil", "--rate", "200",
                             "--output", str(out), "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(proc) -> None:
    if proc is not None:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def _top(raw: Path, n: int = 12) -> list[tuple[str, float]]:
    """The functions with the most samples anywhere on the stack (inclusive share)."""
    total, counts = 0, {}
    for line in raw.read_text().splitlines():
        stack, _, c = line.rpartition(" ")
        c = int(c)
        total += c
        for frame in set(stack.split(";")):
            counts[frame] = counts.get(frame, 0) + c
    return [(f, round(100 * c / max(total, 1), 1)) for f, c in sorted(counts.items(), key=lambda x: -x[1])[:n]]


class RocksdbReference:
    """The same operations straight on rocksdict, at its best: the KV tablet's own options
    (`_open_rdict`, the very function the tablets open with, so any tuning applies to both
    sides alike: bloom filters, block cache with pinned L0 index/filter blocks, data-block
    hash index, the shared row cache), keys sorted as the
    tablet sorts them (multi-gets and write batches in key order: measured ~2x faster than
    unsorted on this data), keys and values encoded before any clock starts. Per upsert
    batch one multi-get of its keys and one write batch of its encoded rows; multi-gets of
    the same 1,000-key batches; single gets. Its lookup rounds alternate with the broker's,
    so both see the same load."""

    def __init__(self, tmp: Path, buckets: int):
        from fluvial.kv.row_codec import KeyLayout, RowCodec
        from fluvial.kv.tablet import _open_rdict, _write_options
        self.layout = KeyLayout(SCHEMA, ["id"])
        self.codec = RowCodec(SCHEMA, {})
        self.buckets = buckets
        self.dbs = [_open_rdict(tmp / f"ref-{b}", True) for b in range(buckets)]
        self.opts = _write_options()

    def _split(self, table: pa.Table, keys: pa.Array) -> list[np.ndarray]:
        """Row positions per database (ids spread by modulo: the reference needs no murmur2),
        each in key order."""
        ids = table.column("id").to_numpy()
        order = pc.array_sort_indices(keys).to_numpy()
        return [order[ids[order] % self.buckets == b] for b in range(self.buckets)]

    def upserts(self, batches: list[pa.Table]) -> float:
        from rocksdict import WriteBatch

        from fluvial.kv.row_codec import struct_of
        encoded = []
        for t in batches:
            keys = self.layout.storage_keys(t)
            values = self.codec.encode(struct_of(t))
            encoded.append([(keys.take(sel).to_pylist(), values.take(sel).to_pylist()) for sel in self._split(t, keys)])
        rows = 0
        start = time.perf_counter()
        for per in encoded:
            for b, (keys, values) in enumerate(per):
                self.dbs[b].get(keys)
                wb = WriteBatch(raw_mode=True)
                for k, v in zip(keys, values):
                    wb.put(k, v)
                self.dbs[b].write(wb, self.opts)
                rows += len(keys)
        return rows / (time.perf_counter() - start)

    def prepare_lookups(self, lookup_keys: list[pa.Table], singles: np.ndarray) -> None:
        self.lookups = []
        for t in lookup_keys:
            keys = self.layout.storage_keys(t)
            self.lookups.append([keys.take(sel).to_pylist() for sel in self._split(t, keys)])
        self.singles = [(int(k) % self.buckets,
                         self.layout.storage_keys(pa.table({"id": pa.array([int(k)], pa.int64())}))[0].as_py())
                        for k in singles]

    def multi_gets(self) -> float:
        found = 0
        start = time.perf_counter()
        for per in self.lookups:
            for b, keys in enumerate(per):
                values = self.dbs[b].get(keys)
                found += len(values) - values.count(None)
        rate = 1000 * len(self.lookups) / (time.perf_counter() - start)
        assert found == 1000 * len(self.lookups), found
        return rate

    def single_gets(self) -> np.ndarray:
        lat = []
        for b, k in self.singles:
            s = time.perf_counter()
            self.dbs[b].get(k)
            lat.append(time.perf_counter() - s)
        return np.array(lat) * 1000

    def flush(self) -> None:
        for db in self.dbs:
            db.flush(True)

    def close(self) -> None:
        for db in self.dbs:
            db.close()


def _spread(values: list[float], digits: int = 0) -> dict:
    """Median and worst of per-round figures (rates: worst = lowest)."""
    return {"median": round(float(np.median(values)), digits), "worst": round(float(min(values)), digits),
            "rounds": [round(float(v), digits) for v in values]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=50_000)
    ap.add_argument("--buckets", type=int, default=2)
    ap.add_argument("--lookup-batches", type=int, default=200)
    ap.add_argument("--single-lookups", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=1,
                    help="lookup rounds run first for broker and rocksdict alike and not counted (cold SST blocks)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of the lookup phases, and runs the upsert pass is cut into (median and worst reported)")
    ap.add_argument("--profile", type=Path, default=None,
                    help="directory: py-spy profiles (collapsed stacks) of the broker per phase")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    # The workload is generated before any clock starts.
    batches = []
    written = 0
    inserts_per_batch = args.batch * 8 // 10
    while written < args.keys:
        new = np.arange(written, min(written + inserts_per_batch, args.keys), dtype=np.int64)
        old = rng.integers(0, max(written, 1), args.batch - new.size) if written else np.zeros(0, np.int64)
        batches.append(rows(rng, np.concatenate([new, old])))
        written += new.size
    upserted = sum(t.num_rows for t in batches)
    lookup_keys = [pa.table({"id": rng.integers(0, args.keys, 1000)}) for _ in range(args.lookup_batches)]
    single_ids = rng.integers(0, args.keys, args.single_lookups)
    singles = [pa.table({"id": pa.array([int(k)], pa.int64())}) for k in single_ids]
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    prof = (lambda name: args.profile / f"pk-{name}.txt") if args.profile else (lambda name: None)
    load = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data", "--flush-policy", "ack").start()
        try:
            with fc.connect(broker.flight_url) as client:
                t = client.create_table("accounts", SCHEMA, buckets=args.buckets, kafka_format="avro",
                                        primary_key=["id"])
                p = _profiler(broker.proc.pid, prof("upsert"))
                batch_s = []
                for batch in batches:
                    s = time.perf_counter()
                    t.upsert(batch)
                    batch_s.append(time.perf_counter() - s)
                upsert_s = sum(batch_s)
                # The single pass of upserts, cut into `rounds` runs of consecutive batches.
                cuts = np.array_split(np.arange(len(batches)), min(args.rounds, len(batches)))
                upsert_rounds = [sum(batches[i].num_rows for i in c) / sum(batch_s[i] for i in c) for c in cuts]
                _stop(p)
                load.append(os.getloadavg()[0])

                # The reference's writes, then lookup rounds alternating broker / rocksdict.
                # Both are flushed first, outside the clocks (the broker's tablets by a KV
                # snapshot): lookups then read SST files through the block and row caches,
                # the steady state of a table larger than its memtables. Rows still in a
                # memtable read ~4x slower, for rocksdict alone too.
                ref = RocksdbReference(Path(tmp), args.buckets)
                ref_upsert = ref.upserts(batches)
                ref.prepare_lookups(lookup_keys, single_ids)
                ref.flush()
                t.snapshot()
                load.append(os.getloadavg()[0])
                rates, p50s, p99s, ref_rates, ref_p50s, ref_p99s = [], [], [], [], [], []
                batch_cpu, single_cpu = [], []  # (broker, client) CPU seconds per lookup, per round
                pipelined, pipelined_cpu = [], []
                # `--warmup` rounds first, for both alike and not counted: the first round
                # reads cold SST blocks (broker and rocksdict). The profiles sample the first
                # counted round (the second round when there is no warm-up).
                profiled = args.warmup if args.warmup else min(1, args.rounds - 1)
                for r in range(args.warmup + args.rounds):
                    p = _profiler(broker.proc.pid, prof("lookup") if r == profiled else None)
                    cpu0, client0 = machine.process_cpu_s(broker.proc.pid), time.process_time()
                    start = time.perf_counter()
                    found = 0
                    for keys in lookup_keys:
                        found += t.lookup(keys).num_rows
                    rates.append(1000 * args.lookup_batches / (time.perf_counter() - start))
                    batch_cpu.append(((machine.process_cpu_s(broker.proc.pid) - cpu0) / args.lookup_batches,
                                      (time.process_time() - client0) / args.lookup_batches))
                    _stop(p)
                    assert found == 1000 * args.lookup_batches, found
                    # The same batches pipelined (Table.lookup_batches, 2 in flight): an extra
                    # row, not the batched figure (that one stays one lookup at a time).
                    cpu0, client0 = machine.process_cpu_s(broker.proc.pid), time.process_time()
                    start = time.perf_counter()
                    found = sum(rows.num_rows for rows in t.lookup_batches(lookup_keys, in_flight=2))
                    pipelined.append(1000 * args.lookup_batches / (time.perf_counter() - start))
                    pipelined_cpu.append(((machine.process_cpu_s(broker.proc.pid) - cpu0) / args.lookup_batches,
                                          (time.process_time() - client0) / args.lookup_batches))
                    assert found == 1000 * args.lookup_batches, found
                    ref_rates.append(ref.multi_gets())
                    p = _profiler(broker.proc.pid, prof("single") if r == profiled else None)
                    latencies = []
                    cpu0, client0 = machine.process_cpu_s(broker.proc.pid), time.process_time()
                    for keys in singles:
                        s = time.perf_counter()
                        got = t.lookup(keys)
                        latencies.append(time.perf_counter() - s)
                        assert got.num_rows == 1
                    single_cpu.append(((machine.process_cpu_s(broker.proc.pid) - cpu0) / len(singles),
                                       (time.process_time() - client0) / len(singles)))
                    _stop(p)
                    lat = np.array(latencies) * 1000
                    p50s.append(float(np.percentile(lat, 50)))
                    p99s.append(float(np.percentile(lat, 99)))
                    ref_lat = ref.single_gets()
                    ref_p50s.append(float(np.percentile(ref_lat, 50)))
                    ref_p99s.append(float(np.percentile(ref_lat, 99)))
                    load.append(os.getloadavg()[0])
                ref.close()
                # Warm-up rounds out of every figure.
                (rates, p50s, p99s, ref_rates, ref_p50s, ref_p99s, batch_cpu, single_cpu, pipelined,
                 pipelined_cpu) = (v[args.warmup:] for v in (rates, p50s, p99s, ref_rates, ref_p50s, ref_p99s,
                                                          batch_cpu, single_cpu, pipelined, pipelined_cpu))
                reference = {"upsert_rows_per_s": round(ref_upsert),
                             "multi_get_keys_per_s": round(float(np.median(ref_rates))),
                             "multi_get_keys_per_s_worst": round(min(ref_rates)),
                             "multi_get_keys_per_s_rounds": [round(x) for x in ref_rates],
                             "single_get_ms": {"p50": round(float(np.median(ref_p50s)), 4),
                                               "p99": round(float(np.median(ref_p99s)), 4),
                                               "p99_worst_round": round(max(ref_p99s), 4)}}
                data_bytes = sum(f.stat().st_size for f in (Path(tmp) / "data" / "kv").rglob("*") if f.is_file())
        finally:
            broker.stop()
    batched = round(float(np.median(rates)))
    out = {
        "benchmark": "pk",
        "keys": args.keys,
        "buckets": args.buckets,
        "upsert_batch_rows": args.batch,
        "upsert_rows": upserted,
        "upsert_rows_per_s": round(upserted / upsert_s),
        "upsert_rows_per_s_median_round": round(float(np.median(upsert_rounds))),
        "upsert_rows_per_s_worst_round": round(min(upsert_rounds)),
        "upsert_rows_per_s_rounds": [round(x) for x in upsert_rounds],
        "upsert_seconds": round(upsert_s, 2),
        "lookup_batch_keys": 1000,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup,
        "batched_lookup_keys_per_s": batched,
        "batched_lookup_keys_per_s_worst": round(min(rates)),
        "batched_lookup_keys_per_s_rounds": [round(x) for x in rates],
        "pipelined_lookup_keys_per_s": round(float(np.median(pipelined))),
        "pipelined_lookup_keys_per_s_worst": round(min(pipelined)),
        "pipelined_lookup_keys_per_s_rounds": [round(x) for x in pipelined],
        "pipelined_lookup_in_flight": 2,
        "single_lookup_ms": {"p50": round(float(np.median(p50s)), 3),
                             "p99": round(float(np.median(p99s)), 3),
                             "p50_worst_round": round(max(p50s), 3),
                             "p99_worst_round": round(max(p99s), 3),
                             "p99_best_round": round(min(p99s), 3),
                             "p99_rounds": [round(x, 3) for x in p99s],
                             "count": args.single_lookups},
        # CPU time per lookup (median of rounds; broker: all its threads, from /proc; client:
        # this process): less sensitive to a shared machine's load than the wall clock.
        "batched_lookup_cpu_ms": {"broker": round(1000 * float(np.median([b for b, _ in batch_cpu])), 3),
                                  "client": round(1000 * float(np.median([c for _, c in batch_cpu])), 3)},
        "pipelined_lookup_cpu_ms": {"broker": round(1000 * float(np.median([b for b, _ in pipelined_cpu])), 3),
                                    "client": round(1000 * float(np.median([c for _, c in pipelined_cpu])), 3)},
        "single_lookup_cpu_us": {"broker": round(1e6 * float(np.median([b for b, _ in single_cpu])), 1),
                                 "client": round(1e6 * float(np.median([c for _, c in single_cpu])), 1)},
        # The physical reference: the same keys and rows straight on rocksdict in this process.
        "rocksdict": reference,
        "batched_lookup_share_of_rocksdict": round(batched / reference["multi_get_keys_per_s"], 3),
        # Per round against the reference round run right after it (same load).
        "batched_lookup_share_of_rocksdict_worst": round(min(a / b for a, b in zip(rates, ref_rates)), 3),
        "upsert_share_of_rocksdict": round(upserted / upsert_s / reference["upsert_rows_per_s"], 3),
        "kv_bytes_on_disk": data_bytes,
        "flush_policy": "ack",
        # The machine may be shared: the load average says how much CPU the run had.
        "load_average_1m": round(float(np.median(load)), 2),
        "load_average_1m_max": round(max(load), 2),
        "load_average_1m_min": round(min(load), 2),
        "machine": machine.describe(),
    }
    print(json.dumps({k: v for k, v in out.items() if k != "machine"}, indent=1))
    if args.profile:
        for name in ("upsert", "lookup", "single"):
            path = prof(name)
            if path.exists():
                print(f"--- broker profile, {name} (inclusive % of samples)")
                for frame, share in _top(path):
                    print(f"{share:6.1f}%  {frame}")
    if not args.no_save:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
