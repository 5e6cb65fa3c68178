"""e2e-trace: where the slowest records of the e2e-latency workload spend their time in Fluvial.

Runs the e2e-latency workload (`benchmarks/workloads/e2e_latency.py`: a confluent-kafka
producer at a fixed rate, a consumer in another process recording each record's offset)
against a Fluvial broker started with timing probes, then follows every measured record
through the broker by its offset, in wall-clock time (the producer's and the consumer's
clocks are the broker's: one machine):

    send_to_append     the producer's linger and request, until `Bucket.append` returned
    append_to_flush    until the group commit's flush of it began (`GroupCommit._begin`):
                       the rest of the loop pass, or a running flush ahead of it
    flush_to_fsync     until the I/O thread started `LogTablet.flush_up_to`
    fsync              the fdatasync itself
    fsync_to_durable   until the loop ran `GroupCommit._flushed` (durable offset moved)
    durable_to_fetch   until a fetch's `_collect` returned it (the woken long-poll)
    fetch_to_consumer  the answer's write and the consumer's receive

Besides: every fsync's duration, event-loop lags over 4 ms (a task sleeping 1 ms that woke
late), garbage collections, and all disk writes of the machine during the window.

    python -m benchmarks.e2e_trace [--rate 5000] [--seconds 30] [--flush-policy ack]

Writes benchmarks/results/e2e-trace.json (stage medians for the median records, the records
between p99 and p99.9, and those above p99.9; the slowest episodes; fsync, lag and GC
figures; the load average). The probes add about 2 us per append and fetch.
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "e2e-trace.json"
TRACE_ENV = "FLUVIAL_E2E_TRACE_OUT"
STAGES = ("send_to_append", "append_to_flush", "flush_to_fsync", "fsync", "fsync_to_durable",
          "durable_to_fetch", "fetch_to_consumer")
LAG_S = 0.004


# --- the broker side: probes installed before `fluvial broker` starts ---------------------------

def _install_probes(out_path: str) -> None:
    """Wrap the steps a record goes through; each event is (start ns, end ns, offset)."""
    from fluvial.broker import server, tables
    from fluvial.broker.handlers import fetch
    from fluvial.broker.log import tablet
    from fluvial.broker.read_ahead import next_offset

    events: dict[str, list[tuple[int, int, int]]] = {
        "append": [], "flush": [], "fsync": [], "durable": [], "fetch": [], "lag": [], "lag_process": [],
        "gc": []}
    now = time.time_ns

    def wrap_sync(owner, name: str, kind: str, offset_of) -> None:
        original = getattr(owner, name)

        def probed(self, *args, **kwargs):
            started = now()
            result = original(self, *args, **kwargs)
            events[kind].append((started, now(), offset_of(self, args)))
            return result
        setattr(owner, name, probed)

    # The log end after an append: the records it covers end there.
    wrap_sync(tables.Bucket, "append", "append", lambda self, args: self.tablet.log_end_offset)
    wrap_sync(tables.GroupCommit, "_begin", "flush", lambda self, args: self._tablet.log_end_offset)
    wrap_sync(tablet.LogTablet, "flush_up_to", "fsync", lambda self, args: args[0])
    wrap_sync(tables.GroupCommit, "_flushed", "durable", lambda self, args: self.durable_offset)

    collect = fetch._collect

    async def probed_collect(ctx, request, wanted, loop):
        started = now()
        results, total = await collect(ctx, request, wanted, loop)
        ends = [next_offset(r.records[-1]) for _, r in results if r.records]
        if ends:
            events["fetch"].append((started, now(), max(ends)))
        return results, total
    fetch._collect = probed_collect

    gc_started = [0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_started[0] = now()
        else:
            events["gc"].append((gc_started[0], now(), info["generation"]))
    gc.callbacks.append(on_gc)

    heartbeat = [time.perf_counter()]

    async def lag_monitor() -> None:
        # The loop thread's own CPU time over a late wake-up tells the broker's work on the
        # loop (near the lag) from waiting for a core or the GIL (near zero).
        # The whole process's CPU time beside it: another of its threads holding the GIL
        # (the I/O threads, the CPU pool) against the machine's other work.
        while True:
            started, cpu_started, process_started = time.perf_counter(), time.thread_time(), time.process_time()
            await asyncio.sleep(0.001)
            heartbeat[0] = took_until = time.perf_counter()
            took = took_until - started
            if took > LAG_S:
                end = now()
                events["lag"].append((end - int(took * 1e9), end, int((time.thread_time() - cpu_started) * 1e6)))
                events["lag_process"].append((end - int(took * 1e9), end,
                                              int((time.process_time() - process_started) * 1e6)))

    # While the loop is late, what its thread is doing (innermost frames): its own work, or
    # waiting in select while another thread holds the GIL or the CPU is elsewhere.
    import threading
    stalls: list[tuple[int, str]] = []
    main_ident = threading.main_thread().ident

    def watch() -> None:
        while True:
            time.sleep(0.005)
            if time.perf_counter() - heartbeat[0] > 0.015:
                frame = sys._current_frames().get(main_ident)
                where = []
                while frame is not None and len(where) < 4:
                    code = frame.f_code
                    where.append(f"{Path(code.co_filename).name}:{code.co_name}")
                    frame = frame.f_back
                stalls.append((now(), " < ".join(where)))
    threading.Thread(target=watch, daemon=True, name="e2e-trace-watch").start()

    start = server.KafkaServer.start

    async def probed_start(self, host, port):
        asyncio.get_running_loop().create_task(lag_monitor())
        return await start(self, host, port)
    server.KafkaServer.start = probed_start

    def dump() -> None:
        np.savez(out_path, **{k: np.array(v, dtype=np.int64).reshape(-1, 3) for k, v in events.items()})
        Path(out_path).with_suffix(".stalls.json").write_text(json.dumps(stalls))
    atexit.register(dump)


def broker_main(argv: list[str]) -> int:
    _install_probes(os.environ[TRACE_ENV])
    from fluvial.broker.cli import main
    return main(argv)


# --- the analysis ----------------------------------------------------------------------------------

def _first_covering(events: np.ndarray, after_ns: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Index of the first event ending at or after `after_ns` whose offset passed each record's
    offset (events covering offsets up to their own, offsets only grow)."""
    order = np.argsort(events[:, 1], kind="stable")
    ev = events[order]
    reach = np.maximum.accumulate(ev[:, 2])
    first = np.maximum(np.searchsorted(ev[:, 1], after_ns, side="left"),
                       np.searchsorted(reach, offsets, side="right"))
    return order[np.minimum(first, len(ev) - 1)]


def attribute(rows: np.ndarray, events: dict[str, np.ndarray]) -> np.ndarray:
    """Per record (rows: send ns, receive ns, offset), the ms of each stage of STAGES."""
    send, received, offsets = rows
    appended = events["append"][_first_covering(events["append"], send, offsets), 1]
    flush = events["flush"][_first_covering(events["flush"], appended, offsets), 0]
    fsync = events["fsync"][_first_covering(events["fsync"], flush, offsets)]
    durable = events["durable"][_first_covering(events["durable"], fsync[:, 1], offsets), 0]
    fetched = events["fetch"][_first_covering(events["fetch"], durable, offsets), 1]
    marks = np.stack([send, appended, flush, fsync[:, 0], fsync[:, 1], durable, fetched, received])
    return np.diff(marks, axis=0) / 1e6


def _share(lags: np.ndarray, lag_ms: np.ndarray) -> float | None:
    """CPU time (third column, us) over wall time of the lags over 20 ms, in %."""
    long = lag_ms > 20
    if not long.any() or len(lags) != len(lag_ms):
        return None
    return round(float(100 * lags[long, 2].sum() / 1e3 / lag_ms[long].sum()), 1)


def summarize(rows: np.ndarray, events: dict[str, np.ndarray]) -> dict[str, object]:
    lo, hi = rows[0].min() - 500_000_000, rows[1].max() + 500_000_000
    events = {k: v[(v[:, 0] >= lo) & (v[:, 0] <= hi)] for k, v in events.items()}
    latency = (rows[1] - rows[0]) / 1e6
    parts = attribute(rows, events)
    order = np.argsort(latency)
    n = len(order)
    # The records around the median (p49.95-p50.05), between p99 and p99.9, and above p99.9.
    groups = {"median": order[int(n * 0.4995):int(n * 0.5005) + 1],
              "p99_to_p999": order[int(n * 0.99):int(n * 0.999)], "over_p999": order[int(n * 0.999):]}
    stage_ms = {name: {stage: round(float(np.median(parts[i, sel])), 2) for i, stage in enumerate(STAGES)}
                | {"latency": round(float(np.median(latency[sel])), 2)} for name, sel in groups.items()}
    # Episodes: runs of records above p99 sent within 50 ms of each other; the worst record of each.
    slow = np.flatnonzero(latency > np.percentile(latency, 99))
    slow = slow[np.argsort(rows[0, slow])]
    at_s = (rows[0] - rows[0].min()) / 1e9
    episodes = np.split(slow, np.flatnonzero(np.diff(at_s[slow]) > 0.05) + 1) if len(slow) else []
    worst = sorted(episodes, key=lambda e: -latency[e].max())[:10]
    episode_rows = []
    for ep in worst:
        j = ep[np.argmax(latency[ep])]
        episode_rows.append({"at_s": round(float(at_s[j]), 2), "records": len(ep),
                             "latency_ms": round(float(latency[j]), 1)}
                            | {stage: round(float(parts[i, j]), 1) for i, stage in enumerate(STAGES)})
    fsync_ms = (events["fsync"][:, 1] - events["fsync"][:, 0]) / 1e6
    lag_ms = (events["lag"][:, 1] - events["lag"][:, 0]) / 1e6
    gc_ms = (events["gc"][:, 1] - events["gc"][:, 0]) / 1e6
    p50, p99, p999 = np.percentile(latency, [50, 99, 99.9])
    return {
        "records": n, "p50_ms": round(float(p50), 2), "p99_ms": round(float(p99), 2), "p999_ms": round(float(p999), 2),
        "stage_median_ms": stage_ms,
        "slowest_episodes": episode_rows,
        "fsyncs": {"count": int(len(fsync_ms)),
                   "p50_ms": round(float(np.percentile(fsync_ms, 50)), 2) if len(fsync_ms) else None,
                   "p99_ms": round(float(np.percentile(fsync_ms, 99)), 2) if len(fsync_ms) else None,
                   "max_ms": round(float(fsync_ms.max()), 1) if len(fsync_ms) else None,
                   "over_10ms": int((fsync_ms > 10).sum()), "over_50ms": int((fsync_ms > 50).sum())},
        "loop_lags": {"over_4ms": int(len(lag_ms)), "over_20ms": int((lag_ms > 20).sum()),
                      "max_ms": round(float(lag_ms.max()), 1) if len(lag_ms) else 0.0,
                      # Of the time the loop was over 20 ms late, the share its thread ran.
                      "over_20ms_running_pct": _share(events["lag"], lag_ms),
                      # ... and the share any of the broker's threads ran (all threads' CPU).
                      "over_20ms_process_running_pct": _share(events["lag_process"], lag_ms)},
        "gc": {"collections": int(len(gc_ms)), "max_ms": round(float(gc_ms.max()), 1) if len(gc_ms) else 0.0,
               "oldest_generation": int(events["gc"][:, 2].max()) if len(gc_ms) else None},
    }


def _stall_places(rows: np.ndarray, stalls: list) -> list[tuple[str, int]]:
    """Where the loop's thread was, sampled every 5 ms while the loop ran over 15 ms late, in
    the measured window: the most frequent places with their sample counts."""
    import collections
    lo, hi = rows[0].min(), rows[1].max()
    return collections.Counter(where for at, where in stalls if lo <= at <= hi).most_common(12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--flush-policy", default="ack", choices=["ack", "none"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import brokers, machine
    from benchmarks.workloads import Scale, e2e_latency

    spec = brokers.FLUVIAL_DEFAULT if args.flush_policy == "ack" else brokers.FLUVIAL_FLUSH_NONE
    workdir = brokers.make_workdir("fluvial-e2e-trace-")
    trace_path = workdir / "trace.npz"
    times_path = workdir / "times.npy"
    os.environ[TRACE_ENV] = str(trace_path)
    load_before = os.getloadavg()[0]
    broker = brokers.start_fluvial(workdir, spec, command=[sys.executable, str(Path(__file__).resolve()), "broker"])
    try:
        figures = e2e_latency._run(broker, Scale(quick=False), args.rate, keep=str(times_path), seconds=args.seconds)
    finally:
        broker.stop()
    try:
        with np.load(trace_path) as trace:
            events = {k: trace[k] for k in trace.files}
        rows = np.load(times_path)
        stalls = json.loads(trace_path.with_suffix(".stalls.json").read_text())
    finally:
        brokers.remove_workdir(workdir)
    result = {
        "description": __doc__.splitlines()[0],
        "settings": {"rate": args.rate, "seconds": args.seconds, "flush_policy": args.flush_policy,
                     "producer": e2e_latency.LATENCY_PRODUCER.__dict__},
        "machine": machine.describe(),
        "load_average_1m": {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2)},
        "workload_figures": {k: round(float(v), 3) for k, v in figures.items()},
    } | summarize(rows, events) | {"loop_late_in": _stall_places(rows, stalls)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("load_average_1m", "p50_ms", "p99_ms", "p999_ms", "stage_median_ms",
                                             "fsyncs", "loop_lags", "gc", "loop_late_in")}, indent=1))
    for episode in result["slowest_episodes"]:
        print(episode)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["broker"]:
        sys.exit(broker_main(sys.argv[1:]))
    main()
