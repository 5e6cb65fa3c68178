"""Workloads: each module defines one `Workload`; add a module and list it in `_MODULES` to add one.

A workload prepares data on a broker once (not timed), then offers cases; the runner times each
case on every system round after round. A case returns its figures by metric name.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from benchmarks import clients
from benchmarks.brokers import RunningBroker


class Chart(str, Enum):
    """Which panel of the chart a metric is drawn in."""

    THROUGHPUT = "throughput"
    LATENCY = "latency"
    MEMORY = "memory"


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    higher_is_better: bool
    chart: Chart | None = None


RECORDS_PER_S = Metric("records/s", "records/s", True, Chart.THROUGHPUT)
MB_PER_S = Metric("MB/s", "MB/s", True)  # MB = 10^6 bytes
BROKER_PEAK_RSS = Metric("broker peak RSS", "MB", False, Chart.MEMORY)


@dataclass(frozen=True)
class Case:
    """One measured thing, e.g. "confluent-kafka, 100 B". `run` gets the broker and the
    per-system state that `Workload.prepare` returned."""

    name: str
    run: Callable[[RunningBroker, object], dict[str, float]]


@dataclass(frozen=True)
class Scale:
    """How big a run is; `quick` is the CI smoke test (about two minutes for everything)."""

    quick: bool
    partitions: int = 1

    def pick(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    @property
    def timeout_s(self) -> float:
        """Longest wait for one produce or consume before the case counts as failed."""
        return self.pick(full=300, quick=30)

    @property
    def admin_timeout_s(self) -> float:
        return self.pick(full=30, quick=10)

    def value_sizes(self, client: str, sizes: tuple[int, ...]) -> tuple[int, ...]:
        """Each Java tool run starts a JVM; the smoke test runs the Java clients at the largest size only."""
        return sizes[-1:] if self.quick and client == "java" else sizes


@dataclass
class Workload:
    name: str
    description: str
    metrics: tuple[Metric, ...]
    cases: Callable[[Scale], list[Case]]
    # Untimed set-up per system (e.g. writing the data a consume workload reads); its result is
    # handed to every case run on that system.
    prepare: Callable[[RunningBroker, Scale], object] = field(default=lambda broker, scale: None)
    settings: Callable[[Scale], dict[str, object]] = field(default=lambda scale: {})

    def metric(self, name: str) -> Metric:
        for m in (*self.metrics, BROKER_PEAK_RSS):
            if m.name == name:
                return m
        raise KeyError(name)


def delete_topic_settled(broker: RunningBroker, topic: str, timeout_s: float = 30.0) -> None:
    """Deletes a case's topic and waits until the system has removed its files, then writes
    back every dirty page (`sync`), so the next system's case starts on a settled disk on
    every system alike. Apache Kafka removes a deleted topic's files asynchronously (its
    first removal after start-up waits for the 30 s initial delay of its deletion task):
    without this, the file system's work of removing hundreds of MB, and any write-back,
    fell into whichever system's case came next."""
    clients.delete_topic(broker.bootstrap, topic)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(broker.workdir.rglob(f"{topic}-*")):
            break
        time.sleep(0.05)
    os.sync()


_MODULES = ("produce_raw", "consume_raw", "e2e_latency", "produce_avro", "consume_avro", "projection_scan")


def all_workloads() -> dict[str, Workload]:
    found: dict[str, Workload] = {}
    for module_name in _MODULES:
        workload = importlib.import_module(f"benchmarks.workloads.{module_name}").WORKLOAD
        found[workload.name] = workload
    return found
