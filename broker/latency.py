"""Latency histograms cheap enough for the request path: a bisect and three additions.

prometheus_client's own Histogram takes a lock and walks its buckets on every
observation; the broker records every Kafka request, so it keeps plain counts here and
the metrics collector turns them into Prometheus histograms when scraped.
"""
from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass, field

# Upper bounds in seconds, from 100 us (a small produce answered from memory) to 10 s
# (long-polling fetches wait up to their max.wait.ms, 500 ms by default).
REQUEST_BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                  5.0, 10.0)
# fsyncs: 50 us (a page-cache-backed file system) to 5 s (a disk in trouble).
FSYNC_BOUNDS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                5.0)
# Event-loop lag: how late a timer fires; anything above 100 ms is felt by every client.
LOOP_LAG_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class LatencyStats:
    """Counts of observations per bucket (the last one is +Inf), their number and sum."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        # Not locked: called from the event loop thread only (see LockedLatencyStats).
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.count += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets: (upper bound as text, observations at or below it)."""
        out = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), list(self.counts)):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


class LockedLatencyStats(LatencyStats):
    """A LatencyStats observed from several threads (fsyncs run on the I/O executor)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self._lock:
            super().observe(seconds)


# Every fsync of a log tablet, whichever broker of the process owns it (the disk is the
# process's, and tools open tablets without a broker).
FSYNC_LATENCY = LockedLatencyStats(FSYNC_BOUNDS)
