"""The disk's own fsync tail, the floor under flush policy `ack`'s end-to-end latency.

Under flush policy `ack` a record is visible to readers once the fsync covering it returns,
so an end-to-end percentile can be no better than the same percentile of the fsyncs on
that disk. This probe writes as a log tablet under the e2e-latency workload does (one
2.6 KB append, then fdatasync, every 5 ms: 5,000 records/s of 100 B in 5 ms batches) and
records the fdatasync durations, next to the same writes into a file whose blocks were
written and fsynced beforehand (an overwrite needs no file-size change, so no journal
commit on ext4/xfs: what a preallocated, zero-filled segment would cost) and into one
preallocated with fallocate (unwritten extents: the first write to a block still changes
metadata). The modes run at the same time, each in its own thread and file, so that they
see the same disturbances; `coincident_pct` is the share of the append mode's fsyncs over
10 ms during which the other mode had an fsync at least half as slow under way (near 100:
the stall is the device's, which no file layout avoids).

    python -m benchmarks.bench_fsync_tail [--syncs 3000] [--rounds 3] [--dir PATH]

Writes benchmarks/results/fsync-tail.json: per mode the median over rounds of p50, p99,
p99.9 and max in ms, each round's figures, and the 1-minute load average per round.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "fsync-tail.json"
WRITE_BYTES = 2600     # one 5 ms batch of 25 records of 100 B, as stored
INTERVAL_S = 0.005     # one flush per produce request at linger.ms=5
MODES = ("append", "overwrite", "fallocate")


def probe(directory: Path, mode: str, syncs: int, start_at: float) -> tuple[np.ndarray, np.ndarray]:
    """Start times (s, perf_counter) and fdatasync durations (ms) of `syncs` writes of
    WRITE_BYTES, INTERVAL_S apart from `start_at`."""
    path = directory / f"fsync-probe-{mode}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if mode == "overwrite":
            os.write(fd, bytes(syncs * WRITE_BYTES + 4096))
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        elif mode == "fallocate":
            os.posix_fallocate(fd, 0, syncs * WRITE_BYTES + 4096)
            os.fsync(fd)
        data = os.urandom(WRITE_BYTES)
        starts = np.empty(syncs)
        durations = np.empty(syncs)
        time.sleep(max(0.0, start_at - time.perf_counter()))
        next_at = time.perf_counter()
        for i in range(syncs):
            os.write(fd, data)
            starts[i] = started = time.perf_counter()
            os.fdatasync(fd)
            durations[i] = time.perf_counter() - started
            next_at += INTERVAL_S
            time.sleep(max(0.0, next_at - time.perf_counter()))
        return starts, durations * 1e3
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def coincident_pct(slow: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray]) -> float | None:
    """Share (%) of `slow`'s fsyncs over 10 ms overlapped by one of `other`'s at least half as long."""
    starts, ms = slow
    other_starts, other_ms = other
    other_ends = other_starts + other_ms / 1e3
    hits = [((other_starts < s + d / 1e3) & (other_ends > s) & (other_ms >= d / 2)).any()
            for s, d in zip(starts, ms) if d > 10]
    return 100 * float(np.mean(hits)) if hits else None


def _median(values) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--syncs", type=int, default=3000, help="fsyncs per mode and round (default 3000, 15 s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write (default: a temporary directory, where the benchmarks' brokers keep data)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="fsync-tail-", dir=args.dir) as tmp:
        for r in range(args.rounds):
            # Files prepared, then every mode's loop from the same instant.
            start_at = time.perf_counter() + 0.5 + args.syncs * WRITE_BYTES / 50e6
            with ThreadPoolExecutor(len(MODES)) as pool:
                runs = dict(zip(MODES, pool.map(lambda m: probe(Path(tmp), m, args.syncs, start_at), MODES)))
            for mode in MODES:
                ms = runs[mode][1]
                p50, p99, p999 = np.percentile(ms, [50, 99, 99.9])
                figures = {"p50_ms": float(p50), "p99_ms": float(p99), "p999_ms": float(p999),
                           "max_ms": float(ms.max()), "over_10ms_pct": float(100 * (ms > 10).mean()),
                           "load_avg_1m": os.getloadavg()[0]}
                if mode != "append":
                    figures["coincident_pct"] = coincident_pct(runs["append"], runs[mode])
                rounds[mode].append(figures)
                print(f"round {r + 1} {mode:9s} p50 {p50:.2f} p99 {p99:.2f} p99.9 {p999:.2f} max {ms.max():.1f} ms, "
                      f"over 10 ms {figures['over_10ms_pct']:.2f}%, load {figures['load_avg_1m']:.1f}"
                      + (f", append's slow fsyncs coinciding: {figures['coincident_pct']:.0f}%"
                         if figures.get("coincident_pct") is not None else ""), flush=True)
    result = {
        "description": __doc__.splitlines()[0],
        "settings": {"write_bytes": WRITE_BYTES, "interval_s": INTERVAL_S, "syncs": args.syncs,
                     "rounds": args.rounds},
        "modes": {m: {key: _median(f.get(key) for f in rounds[m]) for key in rounds[m][0]} | {"rounds": rounds[m]}
                  for m in MODES},
        "load_average_1m": {"min": min(f["load_avg_1m"] for m in MODES for f in rounds[m]),
                            "max": max(f["load_avg_1m"] for m in MODES for f in rounds[m])},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
