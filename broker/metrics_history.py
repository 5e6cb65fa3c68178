"""A short in-process history of throughput and lag, for the console's charts.

Every few seconds (`--metrics-sample-interval-ms`) one sample of cumulative counters and
current lags is kept in a ring buffer (the last 720 samples: an hour at the default 5 s).
Rates are differences between neighbouring samples. A sample reads a handful of
integers per bucket and group on the event loop: no I/O.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fluvial.broker import status

if TYPE_CHECKING:
    from fluvial.broker.broker import Broker
    from fluvial.broker.metrics import LoopLagProbe

log = logging.getLogger(__name__)

HISTORY_SAMPLES = 720


@dataclass(frozen=True)
class Sample:
    at: float  # Unix time, seconds
    records_in: dict[str, int]  # per table, cumulative
    records_out: dict[str, int]
    bytes_in: int  # all tables, cumulative
    bytes_out: int
    group_lag: dict[str, int] = field(default_factory=dict)  # per group, records
    loop_lag_max: float = 0.0  # seconds, the worst since the previous sample


@dataclass(frozen=True)
class Series:
    """One line of a chart: (Unix time, value) points."""

    name: str
    points: list[tuple[float, float]]


class MetricsHistory:
    def __init__(self, broker: "Broker", loop_lag: "LoopLagProbe", interval_s: float):
        self.broker = broker
        self.loop_lag = loop_lag
        self.interval_s = max(0.05, interval_s)
        self.samples: collections.deque[Sample] = collections.deque(maxlen=HISTORY_SAMPLES)

    async def run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a table dropped mid-sample; the next one is whole
                log.debug("metrics history sample failed", exc_info=True)
            await asyncio.sleep(self.interval_s)

    def sample(self) -> Sample:
        records_in: dict[str, int] = {}
        records_out: dict[str, int] = {}
        bytes_in = bytes_out = 0
        for table in status.tables(self.broker):
            buckets = list(table.buckets)
            records_in[table.name] = sum(b.tablet.appended_records for b in buckets)
            records_out[table.name] = sum(b.records_out for b in buckets)
            bytes_in += sum(b.tablet.appended_bytes for b in buckets)
            bytes_out += sum(b.bytes_out for b in buckets)
        lag: dict[str, int] = {}
        for p in status.group_lags(self.broker):
            lag[p.group] = lag.get(p.group, 0) + p.lag
        sample = Sample(time.time(), records_in, records_out, bytes_in, bytes_out, lag, self.loop_lag.max_recent)
        self.loop_lag.max_recent = 0.0
        self.samples.append(sample)
        return sample

    # -- what the charts draw ----------------------------------------------------------------

    def rates(self, table: str | None = None) -> list[Series]:
        """Records per second in and out (one table, or all), between neighbouring samples."""
        samples = list(self.samples)
        series = {"records in/s": [], "records out/s": []}
        for prev, cur in zip(samples, samples[1:]):
            dt = cur.at - prev.at
            if dt <= 0:
                continue
            for name, attr in (("records in/s", "records_in"), ("records out/s", "records_out")):
                now, before = getattr(cur, attr), getattr(prev, attr)
                if table is None:
                    delta = sum(now.values()) - sum(v for k, v in before.items() if k in now)
                else:
                    delta = now.get(table, 0) - before.get(table, 0)
                series[name].append((cur.at, max(0.0, delta / dt)))
        return [Series(n, p) for n, p in series.items()]

    def byte_rates(self) -> list[Series]:
        samples = list(self.samples)
        into, out = [], []
        for prev, cur in zip(samples, samples[1:]):
            dt = cur.at - prev.at
            if dt > 0:
                into.append((cur.at, max(0.0, (cur.bytes_in - prev.bytes_in) / dt)))
                out.append((cur.at, max(0.0, (cur.bytes_out - prev.bytes_out) / dt)))
        return [Series("bytes in/s", into), Series("bytes out/s", out)]

    def group_lag(self, group: str | None = None) -> list[Series]:
        """Total lag of each group (or of one) over time."""
        samples = list(self.samples)
        names = sorted({g for s in samples for g in s.group_lag}) if group is None else [group]
        return [Series(g, [(s.at, float(s.group_lag[g])) for s in samples if g in s.group_lag]) for g in names]

    def loop_lag_series(self) -> list[Series]:
        return [Series("event loop lag (ms)", [(s.at, s.loop_lag_max * 1000) for s in self.samples])]
