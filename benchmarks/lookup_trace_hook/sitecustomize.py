"""Broker-side probes for `benchmarks.pk_tail_trace`, loaded into the broker process only
(this directory is put first on its PYTHONPATH by that script; nothing else imports it).

With `FLUVIAL_LOOKUP_TRACE=<file prefix>`: every lookup served by a lookup session is
timed on its Flight thread (monotonic ns: when the thread began waiting for the keys,
when `read_chunk` returned them with the GIL held, when the answer's write began and
ended) with the thread's scheduler counters (CPU ns, run-queue wait ns, from
/proc/thread-self/schedstat), and every garbage collection of the process is timed
(`gc.callbacks`). Written as JSON lines to `<prefix>-<pid>.jsonl` when a session ends.
With `FLUVIAL_SWITCH_INTERVAL_S`: `sys.setswitchinterval` at startup.
"""
import os
import sys

_interval = os.environ.get("FLUVIAL_SWITCH_INTERVAL_S")
if _interval:
    sys.setswitchinterval(float(_interval))

_prefix = os.environ.get("FLUVIAL_LOOKUP_TRACE")
if _prefix:
    import gc
    import json
    import threading
    import time

    _lock = threading.Lock()
    _gc_events: list = []
    _gc_start = [0]

    def _on_gc(phase, info):
        now = time.monotonic_ns()
        if phase == "start":
            _gc_start[0] = now
        else:
            _gc_events.append([_gc_start[0], now, info.get("generation", -1), info.get("collected", 0)])

    gc.callbacks.append(_on_gc)

    def _sched() -> tuple[int, int]:
        with open("/proc/thread-self/schedstat", "rb") as f:
            cpu, wait, _ = f.read().split()
        return int(cpu), int(wait)

    class _Reader:
        def __init__(self, reader, log):
            self._reader, self._log = reader, log

        def read_chunk(self):
            rd0 = time.monotonic_ns()
            chunk = self._reader.read_chunk()
            recv = time.monotonic_ns()
            cpu, wait = _sched()
            key = None
            if chunk.data is not None and chunk.data.num_rows == 1:
                key = chunk.data.column(0)[0].as_py()
            self._log.append({"rd0": rd0, "recv": recv, "cpu0": cpu, "rq0": wait, "key": key})
            return chunk

    class _Writer:
        def __init__(self, writer, log):
            self._writer, self._log = writer, log

        def begin(self, schema):
            self._writer.begin(schema)

        def write_batch(self, batch):
            wr0 = time.monotonic_ns()
            self._writer.write_batch(batch)
            wr1 = time.monotonic_ns()
            cpu, wait = _sched()
            if self._log:
                self._log[-1].update(wr0=wr0, wr1=wr1, cpu1=cpu, rq1=wait)

    def _install():
        from fluvial.broker.flight import pk as pk_api
        serve = pk_api.lookup_session

        def traced(server, require_read, name, reader, writer):
            log: list = []
            try:
                return serve(server, require_read, name, _Reader(reader, log), _Writer(writer, log))
            finally:
                with _lock:
                    events, _gc_events[:] = list(_gc_events), []
                    with open(f"{_prefix}-{os.getpid()}.jsonl", "a") as out:
                        out.write(json.dumps({"tid": threading.get_native_id(), "lookups": log,
                                              "gc": events}) + "\n")

        pk_api.lookup_session = traced

    _install()
