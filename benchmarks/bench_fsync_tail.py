"""The disk's own fsync tail, the floor under flush policy `ack`'s end-to-end latency.

Under flush policy `ack` a record is visible to readers once the fsync covering it returns,
so an end-to-end percentile can be no better than the same percentile of the fsyncs on
that disk. This probe writes as a log tablet under the e2e-latency workload does (one
2.6 KB write made durable every 5 ms: 5,000 records/s of 100 B in 5 ms batches, about
200 group commits per second) in several file layouts, to see whether one of them cuts the
tail:

- ``append``: pwrite at the end of a growing file, then fdatasync (what a segment does).
  Each fdatasync must also write the inode (new size) and the block allocation.
- ``fallocate``: overwrite inside a file extended with fallocate (unwritten extents: the
  first write to a block still converts the extent, a metadata write per fdatasync).
- ``overwrite``: overwrite inside a file filled with real zeros and fsynced beforehand
  (written extents, no size change: fdatasync writes the data pages and flushes the cache).
- ``odsync``: the same overwrite through an O_DSYNC descriptor (no separate fdatasync).
- ``odsync-append``: appends through an O_DSYNC descriptor.
- ``sfr-append``: append, sync_file_range(WRITE|WAIT_AFTER) to write the page out, then
  fdatasync (the metadata and cache flush left to it).

The modes take turns in one thread (mode i writes in slot k*len(modes)+i), so together
they make the workload's flush rate, and every mode samples the same stretches of the
disk's behaviour. For each durable write the probe also counts the device's completed
writes and cache flushes (``/sys/block/<dev>/stat``) over the call: the medians tell how
many device round trips each layout costs (other processes' I/O adds to the counts); and,
for the writes over 10 ms against the others, how often a discard completed meanwhile
(the filesystem may be mounted with `discard`: deleting a file then discards its blocks
at once) and how much the whole device wrote meanwhile (another process's write-back).

    python -m benchmarks.bench_fsync_tail [--syncs 2000] [--rounds 3] [--dir PATH]

Writes benchmarks/results/fsync-tail.json: per mode the median over rounds of p50, p99,
p99.9 and max in ms, the share over 10 ms, device writes and flushes per durable write,
each round's figures, and the 1-minute load average per round; also the filesystem's
mount options and whether it has a journal.
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
MODES = ("append", "fallocate", "overwrite", "odsync", "odsync-append", "sfr-append")


def _device_of(directory: Path) -> str | None:
    """The block device name (as in /sys/block) holding ``directory``, when it is a whole disk."""
    dev = os.stat(directory).st_dev
    name = f"{os.major(dev)}:{os.minor(dev)}"
    for block in Path("/sys/block").iterdir():
        try:
            if (block / "dev").read_text().strip() == name:
                return block.name
        except OSError:
            continue
    return None


def _filesystem(directory: Path) -> dict:
    """Mount options of the filesystem holding ``directory`` and whether ext4 journals it."""
    best = ("", "", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        device, mount_point, fstype, options = line.split()[:4]
        if str(directory.resolve()).startswith(mount_point) and len(mount_point) > len(best[0]):
            best = (mount_point, fstype, options, device)
    info = {"mount_point": best[0], "type": best[1], "options": best[2]}
    if best[1] == "ext4":
        journal = Path("/sys/fs/ext4") / Path(best[3]).name / "journal_task"
        if journal.exists():
            info["journal_task"] = journal.read_text().strip()  # "<none>": no journal
    return info


class DeviceCounter:
    """Completed writes, cache flushes, sectors written and discards of one block device."""

    def __init__(self, device: str | None):
        self._fd = os.open(f"/sys/block/{device}/stat", os.O_RDONLY) if device else None

    def read(self) -> np.ndarray:
        if self._fd is None:
            return np.zeros(4, dtype=np.int64)
        fields = os.pread(self._fd, 512, 0).split()
        flushes = int(fields[15]) if len(fields) > 15 else 0
        discards = int(fields[11]) if len(fields) > 11 else 0
        return np.array([int(fields[4]), flushes, int(fields[6]), discards], dtype=np.int64)


class Layout:
    """One mode's file and its durable write."""

    def __init__(self, directory: Path, mode: str, syncs: int):
        self.mode = mode
        self.path = directory / f"fsync-probe-{mode}"
        size = syncs * WRITE_BYTES + 4096
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC
        fd = os.open(self.path, flags, 0o644)
        if mode in ("overwrite", "odsync"):
            os.write(fd, bytes(size))
        elif mode == "fallocate":
            os.posix_fallocate(fd, 0, size)
        os.fsync(fd)
        if mode.startswith("odsync"):
            os.close(fd)
            fd = os.open(self.path, os.O_RDWR | os.O_DSYNC)
        self.fd = fd
        self.position = 0

    def durable_write(self, data: bytes) -> None:
        os.pwrite(self.fd, data, self.position)
        if self.mode == "sfr-append":
            _sync_file_range(self.fd, self.position, len(data))
        if not self.mode.startswith("odsync"):
            os.fdatasync(self.fd)
        self.position += len(data)

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


def _sync_file_range(fd: int, offset: int, length: int) -> None:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.sync_file_range
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    # SYNC_FILE_RANGE_WAIT_BEFORE | WRITE | WAIT_AFTER
    if fn(fd, offset, length, 1 | 2 | 4) != 0:
        raise OSError(ctypes.get_errno(), "sync_file_range")


def probe_round(directory: Path, syncs: int, counter: DeviceCounter) -> dict[str, dict]:
    layouts = [Layout(directory, mode, syncs) for mode in MODES]
    data = os.urandom(WRITE_BYTES)
    ms = np.empty((len(MODES), syncs))
    # Per durable write: the device's completed writes, flushes, sectors written and
    # discards over the call (by every process).
    device = np.empty((len(MODES), syncs, 4), dtype=np.int64)
    try:
        next_at = time.perf_counter()
        for k in range(syncs):
            for i, layout in enumerate(layouts):
                before = counter.read()
                started = time.perf_counter()
                layout.durable_write(data)
                ms[i, k] = (time.perf_counter() - started) * 1e3
                device[i, k] = counter.read() - before
                next_at += INTERVAL_S
                time.sleep(max(0.0, next_at - time.perf_counter()))
    finally:
        for layout in layouts:
            layout.close()
    load = os.getloadavg()[0]
    out = {}
    for i, mode in enumerate(MODES):
        p50, p99, p999 = np.percentile(ms[i], [50, 99, 99.9])
        out[mode] = {"p50_ms": float(p50), "p99_ms": float(p99), "p999_ms": float(p999),
                     "max_ms": float(ms[i].max()), "over_10ms_pct": float(100 * (ms[i] > 10).mean()),
                     "device_writes_median": float(np.median(device[i, :, 0])),
                     "device_flushes_median": float(np.median(device[i, :, 1])),
                     "load_avg_1m": load}
    # What else the device did during the slow writes (over 10 ms) and during the others.
    slow = ms > 10
    fast = ~slow
    out["_device_during"] = {
        "slow_writes": int(slow.sum()),
        "slow_with_discard_pct": float(100 * (device[slow][:, 3] > 0).mean()) if slow.any() else None,
        "fast_with_discard_pct": float(100 * (device[fast][:, 3] > 0).mean()),
        "slow_device_kb_written_median": float(np.median(device[slow][:, 2]) / 2) if slow.any() else None,
        "fast_device_kb_written_median": float(np.median(device[fast][:, 2]) / 2),
        "slow_device_mb_written_p90": float(np.percentile(device[slow][:, 2], 90) / 2048) if slow.any() else None,
    }
    return out


def _median(values) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--syncs", type=int, default=2000, help="durable writes per mode and round (default 2000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write (default: a temporary directory, where the benchmarks' brokers keep data)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rounds: dict[str, list[dict]] = {m: [] for m in MODES}
    during = []
    with tempfile.TemporaryDirectory(prefix="fsync-tail-", dir=args.dir) as tmp:
        counter = DeviceCounter(_device_of(Path(tmp)))
        filesystem = _filesystem(Path(tmp))
        for r in range(args.rounds):
            figures = probe_round(Path(tmp), args.syncs, counter)
            during.append(figures.pop("_device_during"))
            for mode in MODES:
                f = figures[mode]
                rounds[mode].append(f)
                print(f"round {r + 1} {mode:13s} p50 {f['p50_ms']:.2f} p99 {f['p99_ms']:.2f} "
                      f"p99.9 {f['p999_ms']:.2f} max {f['max_ms']:.1f} ms, over 10 ms {f['over_10ms_pct']:.2f}%, "
                      f"device writes {f['device_writes_median']:.0f} flushes {f['device_flushes_median']:.0f}, "
                      f"load {f['load_avg_1m']:.1f}", flush=True)
            print(f"round {r + 1} device during slow and other writes: {during[-1]}", flush=True)
    result = {
        "description": __doc__.splitlines()[0],
        "settings": {"write_bytes": WRITE_BYTES, "interval_s": INTERVAL_S, "syncs": args.syncs,
                     "rounds": args.rounds, "modes_take_turns": True},
        "filesystem": filesystem,
        "modes": {m: {key: _median(f.get(key) for f in rounds[m]) for key in rounds[m][0]} | {"rounds": rounds[m]}
                  for m in MODES},
        "device_during_writes": during,
        "load_average_1m": {"min": min(f["load_avg_1m"] for m in MODES for f in rounds[m]),
                            "max": max(f["load_avg_1m"] for m in MODES for f in rounds[m])},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
