"""Scans as Arrow streams: DuckDB, Polars and pyarrow read a large scan with bounded client
memory; expression filters skip batches on the broker like tuple filters.

A table of `--rows` rows (id, score int32, city, amount; about 25 bytes a row in Arrow) is
filled through the client in batches of 500k rows with rising ids. Then, each consumer in a
fresh child process (so its peak RSS is its own), the same scan
`scan(columns=["city", "amount", "score"], filter=pc.field("score") >= 0)` (every row) is read by:

- duckdb: `duckdb.sql("select city, count(*), sum(amount) ... from scan group by city")` (the
  Arrow PyCapsule stream),
- polars: `scan.to_polars(lazy=True).group_by("city").agg(...).collect(engine="streaming")`,
- reader: a loop over `scan.to_reader()` summing with pyarrow.compute,
- to_arrow: the whole result as one table (for contrast: memory grows with the result).

Reported per consumer: seconds, peak RSS while consuming (sampled every 5 ms) and its
growth over the child's RSS after imports and connecting (MB), bytes received. Then pushed-down filters: the same selective condition as
a tuple filter, as an expression (pushed), and as an expression the broker cannot take
(`|` with a never-true condition: applied by the client); batches skipped and bytes received.
Median of `--runs` runs. Saves benchmarks/results/client_streams.json.

    python -m benchmarks.bench_client_streams [--rows 10000000] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

RESULTS = Path(__file__).parent / "results" / "client_streams.json"
TABLE = "events"
APPEND_ROWS = 500_000
SCHEMA = pa.schema([pa.field("id", pa.int64(), False), ("score", pa.int32()), ("city", pa.string()),
                    ("amount", pa.float64())])
CITIES = pa.array(["Oslo", "Lima", "Pune", "Kyiv", "Nice", "Riga", "Bern", "Oulu"])
CONSUMERS = ("duckdb", "polars", "reader", "to_arrow")


def rows(start: int, n: int, rng: np.random.Generator) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "score": pa.array(rng.integers(0, 1000, n, dtype=np.int32)),
                     "city": CITIES.take(pa.array(rng.integers(0, len(CITIES), n))),
                     "amount": rng.random(n) * 100}, schema=SCHEMA)


def fill(client, n: int, buckets: int = 2) -> None:
    import fluvial.client as fc

    try:
        client.drop_table(TABLE)
    except fc.UnknownTableError:
        pass
    t = client.create_table(TABLE, SCHEMA, buckets=buckets)
    rng = np.random.default_rng(7)
    for lo in range(0, n, APPEND_ROWS):
        t.append(rows(lo, min(APPEND_ROWS, n - lo), rng))


def _rss_mb() -> float:
    """This process's resident set now (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _PeakRss:
    """The highest RSS seen while the block runs, sampled every 5 ms (the process's lifetime
    peak, ru_maxrss, would include what imports took before the baseline)."""

    def __enter__(self) -> "_PeakRss":
        import threading

        self.peak = _rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_mb())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mb())


def consume(kind: str, url: str) -> dict:
    """Run one consumer over the full scan in this process; its figures."""
    import duckdb
    import polars as pl

    import fluvial.client as fc

    client = fc.connect(url)
    t = client.table(TABLE)
    scan = t.scan(columns=["city", "amount", "score"], filter=pc.field("score") >= 0)
    # Warm the imports and the connection, so the baseline holds them.
    t.scan(columns=["city"], end={b: 0 for b in range(t.info.buckets)}).to_arrow()
    duckdb.sql("select 1").fetchall()
    base = _rss_mb()
    started = time.perf_counter()
    with _PeakRss() as rss:
        count = _consume(kind, scan)
    seconds = time.perf_counter() - started
    stats = scan.stats
    if kind == "polars":
        stats = None  # polars reads through a scan of its own (narrowed to the columns it uses)
    return {"consumer": kind, "rows": count, "seconds": round(seconds, 3),
            "rss_growth_mb": round(rss.peak - base, 1), "rss_base_mb": round(base, 1),
            "rss_peak_mb": round(rss.peak, 1), "bytes_received": stats.bytes_sent if stats is not None else None}


def _consume(kind: str, scan) -> int:
    import duckdb
    import polars as pl

    if kind == "duckdb":
        result = duckdb.sql("select city, count(*) as n, sum(amount) as total from scan group by city").fetchall()
        count = sum(r[1] for r in result)
    elif kind == "polars":
        frame = (scan.to_polars(lazy=True).group_by("city").agg(pl.len().alias("n"), pl.col("amount").sum())
                 .collect(engine="streaming"))
        count = int(frame["n"].sum())
    elif kind == "reader":
        count, total = 0, 0.0
        for batch in scan.to_reader():
            count += batch.num_rows
            total += pc.sum(batch.column("amount")).as_py() or 0.0
    elif kind == "to_arrow":
        count = scan.to_arrow().num_rows
    else:
        raise ValueError(kind)
    return count


def run_child(kind: str, url: str, cwd: Path | None = None, timeout: float = 900) -> dict:
    """`consume` in a fresh Python process: its peak RSS is this consumer's alone."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_client_streams", "--child", kind, "--url", url],
                         capture_output=True, text=True, timeout=timeout,
                         cwd=str(cwd or Path(__file__).resolve().parent.parent))
    if out.returncode != 0:
        raise RuntimeError(f"{kind} consumer failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def pushdown(client, n: int) -> dict:
    """A selective id range (about 5 % of the rows, in the newest batches) three ways."""
    t = client.table(TABLE)
    low = int(n * 0.95)
    ways = {"tuple": [("id", ">=", low)],
            "expression_pushed": pc.field("id") >= low,
            "expression_client": (pc.field("id") >= low) | (pc.field("id") < -1)}
    out = {}
    for name, flt in ways.items():
        scan = t.scan(columns=["id", "amount"], filter=flt)
        started = time.perf_counter()
        got = scan.to_arrow()
        out[name] = {"seconds": time.perf_counter() - started, "rows": got.num_rows,
                     "batches_read": scan.stats.batches_read, "batches_skipped": scan.stats.batches_skipped,
                     "bytes_received": scan.stats.bytes_sent, "pushed": scan.filter,
                     "client_side": str(scan.client_filter) if scan.client_filter is not None else None}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", choices=CONSUMERS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(consume(args.child, args.url)))
        return

    import fluvial.client as fc
    from benchmarks import machine
    from tests.support.broker_process import BrokerProcess

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fluvial-streams-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        try:
            with fc.connect(broker.flight_url) as client:
                started = time.perf_counter()
                fill(client, args.rows)
                fill_s = time.perf_counter() - started
                consumers: dict[str, list[dict]] = {k: [] for k in CONSUMERS}
                pushes: list[dict] = []
                for _ in range(args.runs):
                    for kind in CONSUMERS:
                        consumers[kind].append(run_child(kind, broker.flight_url))
                    pushes.append(pushdown(client, args.rows))
        finally:
            broker.stop()

    def median(runs: list[dict], key: str) -> float | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return round(statistics.median(values), 3) if values else None

    summary = {k: {"seconds": median(v, "seconds"), "rss_growth_mb": median(v, "rss_growth_mb"),
                   "rows": v[0]["rows"], "bytes_received": median(v, "bytes_received"),
                   "rows_per_s": round(v[0]["rows"] / median(v, "seconds")) if median(v, "seconds") else None}
               for k, v in consumers.items()}
    push = {k: {"seconds": round(statistics.median(p[k]["seconds"] for p in pushes), 4),
                **{f: pushes[0][k][f] for f in ("rows", "batches_read", "batches_skipped", "bytes_received",
                                                 "pushed", "client_side")}}
            for k in pushes[0]}
    out = {"benchmark": "client_streams", "rows": args.rows, "runs": args.runs, "fill_seconds": round(fill_s, 1),
           "table_bytes_arrow": args.rows * 25, "consumers": summary, "pushdown": push,
           "raw": {"consumers": consumers},
           "machine": machine.describe(),
           "load_average": {"before": [round(x, 2) for x in load_before],
                            "after": [round(x, 2) for x in os.getloadavg()]}}
    print(json.dumps({"consumers": summary, "pushdown": push}, indent=1))
    if not args.no_save:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
