"""gRPC's socket I/O on the calling thread (Flight's client and server).

The gRPC bundled with pyarrow does a stream's socket reads and writes on its EventEngine
threads by default: a message written by a Flight thread is handed to one of them to be
sent, and one received is read by another that then wakes the thread waiting for it. A
lookup's round trip (one message each way) thereby woke about six threads across the two
processes instead of two or three, each a chance to wait for a core on a busy machine:
single-key lookups traced call by call (`benchmarks/pk_tail_trace.py`) had their slow calls
waiting in the run queue of those EventEngine threads (about 1 ms of run-queue wait per slow
call, against about 0.1 ms in the median call), not in Python, the GIL or collections.
Turning gRPC's EventEngine experiments off puts the I/O back on the thread that waits for
it (gRPC's polling engine), which is what `inline_io` does, before gRPC starts in the
process. An operator's own `GRPC_EXPERIMENTS` is left as it is (set it empty for gRPC's
defaults).
"""
from __future__ import annotations

import os

# The experiments moving a stream's I/O to EventEngine threads; `-` turns one off.
INLINE_IO_EXPERIMENTS = ",".join(f"-{name}" for name in (
    "event_engine_client", "event_engine_listener", "event_engine_for_all_other_endpoints",
    "event_engine_callback_cq"))


def inline_io() -> bool:
    """Ask gRPC (read when it starts in this process) to do socket I/O on the calling
    thread, unless `GRPC_EXPERIMENTS` is already set. True when set here."""
    if "GRPC_EXPERIMENTS" in os.environ:
        return False
    os.environ["GRPC_EXPERIMENTS"] = INLINE_IO_EXPERIMENTS
    return True
