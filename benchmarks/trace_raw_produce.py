"""Where a large produce request's time goes in the broker: each stage of the pipelined path.

Starts a Fluvial broker with timing probes, produces `--records` raw values of `--size`
bytes with Apache Kafka's Java producer (ProducerPerformance, the produce-raw settings:
batches of up to 1 MB, five requests in flight), then follows each request through the
broker (stages in wall-clock time, medians and means over the requests):

    read_to_job        the frame handled on the loop until its executor job started
    convert            the batch checked and converted to Arrow (executor thread)
    job_to_append      waiting for the bucket's previous job to append
    append             the segment write into the page cache
    append_to_fsync    until the flush covering it began its fsync (a loop pass to start the
                       group commit's flush, an I/O thread picking it up, or a running flush)
    fsync              its flush's fsync
    fsync_to_answer    the flush published on the loop, the answer made

Besides: how many requests the broker held at once on average (the producer allows five),
the gap between request arrivals, how many appends found a flush already under way, each
stage's CPU time on its thread, and the producer's own mean send-to-ack latency.

    python -m benchmarks.trace_raw_produce [--flush-policy ack|none] [--records 500000] [--label L]

Writes benchmarks/results/trace-raw-produce[-<label>].json. The probes add a few
microseconds per request.
"""
from __future__ import annotations

import argparse
import atexit
import bisect
import json
import os
import statistics
import sys
import time
from pathlib import Path

TRACE_ENV = "FLUVIAL_TRACE_RAW_PRODUCE"


# --- the broker side: probes installed before `fluvial broker` starts ---------------------------

def _install_probes(out_path: str) -> None:
    """Wrap each step; an event is (kind, start, end, offset, thread CPU seconds)."""
    from fluvial.broker import request_stats, server, tables
    from fluvial.broker.handlers import produce
    from fluvial.broker.log import tablet

    events: list[tuple[str, float, float, int, float]] = []
    now, cpu = time.perf_counter, time.thread_time

    def wrap(owner, name: str, kind: str, offset_of=lambda args: 0) -> None:
        original = getattr(owner, name)

        def probed(*args, **kwargs):
            started, cpu_started = now(), cpu()
            result = original(*args, **kwargs)
            events.append((kind, started, now(), offset_of(args), cpu() - cpu_started))
            return result
        setattr(owner, name, probed)

    def end_of(written) -> int:
        return -1 if written is None else written.base_offset + written.record_count

    wrap(server.KafkaServer, "dispatch_now", "handle")
    wrap(produce, "_append_after", "job")
    wrap(produce, "_convert", "convert")
    wrap(produce, "_append_converted", "append", lambda args: end_of(args[0].written))
    wrap(tablet.LogTablet, "flush_up_to", "fsync", lambda args: args[1])
    observe = request_stats.RequestStats.observe

    def observed(self, api_key: int, seconds: float) -> None:
        if api_key == 0:  # Produce: read to answer ready
            t = now()
            events.append(("answer", t - seconds, t, 0, 0.0))
        observe(self, api_key, seconds)
    request_stats.RequestStats.observe = observed
    del tables

    atexit.register(lambda: Path(out_path).write_text(json.dumps(events)))


def broker_main(argv: list[str]) -> int:
    import signal
    _install_probes(os.environ[TRACE_ENV])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # atexit runs
    from fluvial.broker.cli import main
    return main(argv)


# --- the analysis ----------------------------------------------------------------------------------

def _summary(values: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    return {"median_ms": round(statistics.median(ms), 3), "mean_ms": round(statistics.mean(ms), 3),
            "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3)}


def _within(steps: list, job: tuple) -> tuple | None:
    """The step (sorted by start) that ran inside ``job`` (a step of that job's thread)."""
    i = bisect.bisect_left(steps, (job[0],))
    return steps[i] if i < len(steps) and steps[i][1] <= job[1] else None


def analyse(events: list) -> dict[str, object]:
    by: dict[str, list] = {}
    for kind, start, end, offset, cpu_s in events:
        by.setdefault(kind, []).append((start, end, offset, cpu_s))
    jobs, appends = sorted(by.get("job", [])), sorted(by.get("append", []))
    converts = sorted(by.get("convert", []))
    fsyncs = sorted((e for e in by.get("fsync", []) if e[1] - e[0] > 0), key=lambda e: e[1])
    answers = sorted(by.get("answer", []))
    if not jobs or not answers:
        raise SystemExit("no pipelined produce requests were traced")
    job_starts = [j[0] for j in jobs]
    stages: dict[str, list[float]] = {k: [] for k in (
        "read_to_job", "convert", "job_to_append", "append", "append_to_fsync", "fsync", "fsync_to_answer", "total")}
    waited = stages["fsync"]
    under_way = 0
    for read, answered, _, _ in answers:
        i = bisect.bisect_left(job_starts, read)
        if i >= len(jobs) or jobs[i][0] - read > 0.05:
            continue
        job = jobs[i]
        conv, append = _within(converts, job), _within(appends, job)
        if conv is None or append is None or append[2] < 0:
            continue
        a0, a1, end, _ = append
        stages["read_to_job"].append(job[0] - read)
        stages["convert"].append(conv[1] - conv[0])
        stages["job_to_append"].append(a0 - conv[1])
        stages["append"].append(a1 - a0)
        stages["total"].append(answered - read)
        # The flush that made it durable: the first to end after the append covering its end
        # (none before the answer under flush policy `none`).
        flush = next((f for f in fsyncs if f[2] >= end and f[1] >= a1), None)
        if flush is not None and flush[1] <= answered:
            under_way += any(f0 <= a1 < f1 for f0, f1, _, _ in fsyncs)
            stages["append_to_fsync"].append(max(0.0, flush[0] - a1))
            stages["fsync"].append(flush[1] - max(flush[0], a1))
            stages["fsync_to_answer"].append(answered - flush[1])
    traced = len(stages["total"])
    span = answers[-1][1] - answers[0][0]
    arrivals = [a[0] for a in answers]
    return {
        "requests": len(answers), "requests_traced": traced,
        "stages": {k: _summary(v) for k, v in stages.items() if v},
        # Little's law over the run: the requests the broker held at once, on average.
        "requests_in_broker_mean": round(sum(a[1] - a[0] for a in answers) / span, 2),
        "arrival_gap": _summary([b - a for a, b in zip(arrivals, arrivals[1:])]),
        "appends_finding_a_flush_under_way": round(under_way / max(1, len(waited)), 3),
        "flushes": len(fsyncs),
        "flush_busy_share": round(sum(f[1] - f[0] for f in fsyncs) / span, 3) if fsyncs else 0.0,
        "cpu_ms_per_request": {k: round(1000 * statistics.mean(e[3] for e in by[k]), 3)
                               for k in ("convert", "append", "fsync") if by.get(k)},
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "broker":
        sys.exit(broker_main(sys.argv[1:]))  # `fluvial broker ...`
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flush-policy", choices=("ack", "none"), default="ack")
    p.add_argument("--records", type=int, default=500_000)
    p.add_argument("--size", type=int, default=1000)
    p.add_argument("--label", default="")
    args = p.parse_args()
    from benchmarks import brokers, clients, machine
    spec = brokers.FLUVIAL_DEFAULT if args.flush_policy == "ack" else brokers.FLUVIAL_FLUSH_NONE
    workdir = brokers.make_workdir("fluvial-trace-raw-produce-")
    trace_path = workdir / "trace.json"
    os.environ[TRACE_ENV] = str(trace_path)
    load_before = os.getloadavg()
    broker = brokers.start_fluvial(workdir, spec, command=[sys.executable, str(Path(__file__).resolve()), "broker"])
    try:
        topic = clients.unique_name("trace-raw")
        clients.create_topic(broker.bootstrap, topic, 1)
        figures = clients.produce_java(broker.bootstrap, topic, args.records, args.size, 300).figures()
    finally:
        broker.stop()
    try:
        events = json.loads(trace_path.read_text())
    finally:
        brokers.remove_workdir(workdir)
    result = {"workload": "trace-raw-produce", "description": __doc__.splitlines()[0], "machine": machine.describe(),
              "settings": {"flush_policy": args.flush_policy, "records": args.records, "size": args.size,
                           "client": "java"},
              "produce": figures, **analyse(events), "loadavg_before": load_before, "loadavg": os.getloadavg()}
    name = "trace-raw-produce" + (f"-{args.label}" if args.label else "") + ".json"
    out = Path(__file__).parent / "results" / name
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
