"""Runs workloads against every system in alternating rounds and collects the figures per round."""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import brokers, stats
from benchmarks.brokers import KafkaFrom, RunningBroker, RssSampler, SystemSpec
from benchmarks.workloads import BROKER_PEAK_RSS, Scale, Workload

BASELINE = "kafka"


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Failure:
    system: str
    case: str
    round: int | None
    error: str


@dataclass
class WorkloadResult:
    workload: Workload
    scale: Scale
    systems: Sequence[SystemSpec]
    rounds: int
    warmup_rounds: int
    command: str
    machine: dict[str, object]
    versions: dict[str, str] = field(default_factory=dict)
    started: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    # (case, metric) -> system -> round -> value
    values: dict[tuple[str, str], dict[str, dict[int, float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict)))
    case_order: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    # 1-minute load average when the workload started and ended: other work on the machine
    # shows up here, and figures taken under load are noisy.
    load_average: dict[str, float] = field(default_factory=dict)

    def record(self, case: str, system: str, round_no: int, figures: dict[str, float]) -> None:
        if case not in self.case_order:
            self.case_order.append(case)
        for metric, value in figures.items():
            self.values[(case, metric)][system][round_no] = float(value)

    def to_json(self) -> dict[str, object]:
        cases = []
        for case in self.case_order:
            metrics = []
            for metric in (*self.workload.metrics, BROKER_PEAK_RSS):
                by_system = self.values.get((case, metric.name))
                if by_system is None:
                    continue
                counted = {s.name: stats.counted(by_system.get(s.name, {}), self.warmup_rounds)
                           for s in self.systems}
                systems = {
                    s.name: {
                        "rounds": {str(r): v for r, v in sorted(by_system.get(s.name, {}).items())},
                        "summary": _json_summary(stats.summarize(list(counted[s.name].values()))),
                    }
                    for s in self.systems
                }
                ratios = {
                    s.name: _json_summary(stats.ratio_summary(counted[s.name], counted.get(BASELINE, {})))
                    for s in self.systems if s.name != BASELINE
                }
                # Each counted round pair's own ratio, so the worst pair is visible, not only the range.
                baseline = counted.get(BASELINE, {})
                round_ratios = {
                    s.name: {str(r): counted[s.name][r] / baseline[r]
                             for r in sorted(counted[s.name].keys() & baseline.keys()) if baseline[r]}
                    for s in self.systems if s.name != BASELINE
                }
                metrics.append({
                    "metric": metric.name, "unit": metric.unit, "higher_is_better": metric.higher_is_better,
                    "chart": metric.chart.value if metric.chart else None,
                    "systems": systems, "ratio_to_kafka": ratios, "ratio_to_kafka_by_round": round_ratios,
                })
            cases.append({"case": case, "metrics": metrics})
        return {
            "workload": self.workload.name,
            "description": self.workload.description,
            "started": self.started,
            "command": self.command,
            "mode": "quick" if self.scale.quick else "full",
            "rounds": self.rounds,
            "warmup_rounds": self.warmup_rounds,
            "baseline": BASELINE,
            "machine": self.machine,
            "load_average_1m": self.load_average,
            "settings": self.workload.settings(self.scale),
            "systems": [
                {"name": s.name, "label": s.label, "durability": s.durability,
                 "flush_policy": s.flush_policy, "version": self.versions.get(s.name, "not started")}
                for s in self.systems
            ],
            "cases": cases,
            "failures": [f.__dict__ for f in self.failures],
        }


def _json_summary(summary: stats.Summary | None) -> dict[str, float | int] | None:
    return summary.to_json() if summary is not None else None


class Fleet:
    """The brokers of one run: started once, restarted at a workload boundary if one died."""

    def __init__(self, systems: Sequence[SystemSpec], workdir: Path, kafka_from: KafkaFrom) -> None:
        self._systems = systems
        self._workdir = workdir
        self._kafka_from = kafka_from
        self._running: dict[str, RunningBroker] = {}
        self._start_errors: dict[str, str] = {}
        self._generation = 0

    def ensure_started(self) -> None:
        """Starts what is not running; a broker that died or stopped answering is restarted."""
        self._generation += 1
        for spec in self._systems:
            broker = self._running.get(spec.name)
            if broker is not None and broker.alive() and brokers.responsive(broker.bootstrap):
                continue
            if broker is not None:
                state = "stopped answering" if broker.alive() else "exited"
                log(f"{spec.name} {state}; restarting it. Log tail:\n{broker.log_tail(1500)}")
                broker.stop()
            try:
                log(f"starting {spec.label}")
                started = time.monotonic()
                self._running[spec.name] = brokers.start_system(
                    spec, self._workdir / f"{spec.name}-{self._generation}", self._kafka_from)
                self._start_errors.pop(spec.name, None)
                log(f"{spec.name} serving at {self._running[spec.name].bootstrap} "
                    f"after {time.monotonic() - started:.1f}s")
            except Exception as exc:
                self._running.pop(spec.name, None)
                self._start_errors[spec.name] = f"{type(exc).__name__}: {exc}"
                log(f"{spec.name} failed to start: {_short(self._start_errors[spec.name])}")

    def get(self, name: str) -> RunningBroker | None:
        broker = self._running.get(name)
        return broker if broker is not None and broker.alive() else None

    def unavailable_reason(self, name: str) -> str:
        if name in self._start_errors:
            return f"broker did not start: {self._start_errors[name]}"
        broker = self._running.get(name)
        if broker is not None and not broker.alive():
            return f"broker process exited; log tail:\n{broker.log_tail(1500)}"
        return "broker not running"

    def versions(self) -> dict[str, str]:
        return {name: broker.version for name, broker in self._running.items()}

    def stop_all(self) -> None:
        for broker in self._running.values():
            try:
                broker.stop()
            except Exception as exc:
                log(f"stopping {broker.spec.name}: {exc}")
        self._running.clear()


def _short(text: str, limit: int = 300) -> str:
    first = text.strip().splitlines()[0] if text.strip() else text
    return first[:limit]


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, brokers.BrokerStartError) and type(exc).__name__ != "CaseFailed":
        text += "\n" + "".join(traceback.format_exception(exc)[-3:])
    return text[-4000:]


def round_order(systems: Sequence[SystemSpec], round_no: int) -> list[SystemSpec]:
    """A B C in even rounds, C B A in odd ones: no system always runs right after another."""
    return list(systems) if round_no % 2 == 0 else list(reversed(systems))


def run_workload(workload: Workload, fleet: Fleet, systems: Sequence[SystemSpec], scale: Scale,
                 rounds: int, warmup_rounds: int, command: str, machine: dict[str, object],
                 on_step: Callable[[], None] | None = None) -> WorkloadResult:
    """Every case of the workload on every system, `rounds` times; `on_step()` after each
    (system, case, round) run, done or given up (the progress bar)."""
    result = WorkloadResult(workload=workload, scale=scale, systems=systems, rounds=rounds,
                            warmup_rounds=warmup_rounds, command=command, machine=machine)
    result.load_average["start"] = round(os.getloadavg()[0], 2)
    fleet.ensure_started()
    result.versions = fleet.versions()
    cases = workload.cases(scale)
    result.case_order = [c.name for c in cases]

    prepared: dict[str, object] = {}
    given_up: set[tuple[str, str]] = set()  # (system, case) that failed once: not retried
    for spec in systems:
        broker = fleet.get(spec.name)
        if broker is None:
            result.failures.append(Failure(spec.name, "*", None, fleet.unavailable_reason(spec.name)))
            given_up.update((spec.name, c.name) for c in cases)
            continue
        try:
            log(f"[{workload.name}] preparing {spec.name}")
            prepared[spec.name] = workload.prepare(broker, scale)
        except Exception as exc:
            result.failures.append(Failure(spec.name, "prepare", None, _error_text(exc)))
            log(f"[{workload.name}] {spec.name} prepare failed: {_short(str(exc))}")
            given_up.update((spec.name, c.name) for c in cases)

    for round_no in range(rounds):
        tag = "warm-up" if round_no < warmup_rounds else "counted"
        for case in cases:
            for spec in round_order(systems, round_no):
                try:
                    if (spec.name, case.name) in given_up:
                        continue
                    broker = fleet.get(spec.name)
                    if broker is None:
                        result.failures.append(Failure(spec.name, case.name, round_no,
                                                       fleet.unavailable_reason(spec.name)))
                        given_up.add((spec.name, case.name))
                        continue
                    try:
                        with RssSampler(broker.pid) as rss:
                            figures = case.run(broker, prepared.get(spec.name))
                        figures[BROKER_PEAK_RSS.name] = rss.peak_bytes / 1e6
                    except Exception as exc:
                        result.failures.append(Failure(spec.name, case.name, round_no, _error_text(exc)))
                        given_up.add((spec.name, case.name))
                        log(f"[{workload.name}] round {round_no + 1}/{rounds} ({tag}) {spec.name} "
                            f"{case.name}: FAILED {_short(_error_text(exc))}")
                        # A wedged broker would make every later case wait for its timeout.
                        if not (broker.alive() and brokers.responsive(broker.bootstrap)):
                            reason = "broker stopped answering after a failed case; not run"
                            log(f"[{workload.name}] {spec.name}: {reason} for the rest of this workload")
                            for other in cases:
                                if (spec.name, other.name) not in given_up:
                                    given_up.add((spec.name, other.name))
                                    result.failures.append(Failure(spec.name, other.name, round_no, reason))
                        continue
                    result.record(case.name, spec.name, round_no, figures)
                    shown = ", ".join(f"{k} {stats.format_value(v)}" for k, v in figures.items())
                    log(f"[{workload.name}] round {round_no + 1}/{rounds} ({tag}) {spec.name} {case.name}: {shown}")
                finally:
                    if on_step is not None:
                        on_step()
    result.load_average["end"] = round(os.getloadavg()[0], 2)
    return result
