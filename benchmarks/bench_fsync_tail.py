"""The disk's own fsync tail, the floor under flush policy `ack`'s end-to-end latency.

Under flush policy `ack` a record is visible to readers once the fsync covering it returns,
so an end-to-end percentile can be no better than the same percentile of the fsyncs on
that disk. This probe writes as a log tablet under the e2e-latency workload does (one
2.6 KB append, then fdatasync, every 5 ms: 5,000 records/s of 100 B in 5 ms batches) and
records the fdatasync durations, next to the same writes into a file whose blocks were
written and fsynced beforehand (an overwrite needs no file-size change, so no journal
commit on ext4/xfs: what a preallocated segment would cost).

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
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "fsync-tail.json"
WRITE_BYTES = 2600     # one 5 ms batch of 25 records of 100 B, as stored
INTERVAL_S = 0.005     # one flush per produce request at linger.ms=5
MODES = ("append", "overwrite")


def probe(directory: Path, mode: str, syncs: int) -> np.ndarray:
    """fdatasync durations in ms of `syncs` writes of WRITE_BYTES, INTERVAL_S apart."""
    path = directory / f"fsync-probe-{mode}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if mode == "overwrite":
            os.write(fd, bytes(syncs * WRITE_BYTES + 4096))
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        data = os.urandom(WRITE_BYTES)
        durations = np.empty(syncs)
        next_at = time.perf_counter()
        for i in range(syncs):
            os.write(fd, data)
            started = time.perf_counter()
            os.fdatasync(fd)
            durations[i] = time.perf_counter() - started
            next_at += INTERVAL_S
            time.sleep(max(0.0, next_at - time.perf_counter()))
        return durations * 1e3
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


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
            for mode in MODES if r % 2 == 0 else reversed(MODES):
                ms = probe(Path(tmp), mode, args.syncs)
                p50, p99, p999 = np.percentile(ms, [50, 99, 99.9])
                figures = {"p50_ms": float(p50), "p99_ms": float(p99), "p999_ms": float(p999),
                           "max_ms": float(ms.max()), "over_10ms_pct": float(100 * (ms > 10).mean()),
                           "load_avg_1m": os.getloadavg()[0]}
                rounds[mode].append(figures)
                print(f"round {r + 1} {mode:9s} p50 {p50:.2f} p99 {p99:.2f} p99.9 {p999:.2f} max {ms.max():.1f} ms, "
                      f"over 10 ms {figures['over_10ms_pct']:.2f}%, load {figures['load_avg_1m']:.1f}", flush=True)
    result = {
        "description": __doc__.splitlines()[0],
        "settings": {"write_bytes": WRITE_BYTES, "interval_s": INTERVAL_S, "syncs": args.syncs,
                     "rounds": args.rounds},
        "modes": {m: {key: statistics.median(f[key] for f in rounds[m]) for key in rounds[m][0]} | {"rounds": rounds[m]}
                  for m in MODES},
        "load_average_1m": {"min": min(f["load_avg_1m"] for m in MODES for f in rounds[m]),
                            "max": max(f["load_avg_1m"] for m in MODES for f in rounds[m])},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
