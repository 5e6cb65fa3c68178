"""security: what SASL_SSL (SCRAM-SHA-512 over TLS) costs against PLAINTEXT, Fluvial and Apache Kafka side by side.

Both systems are configured the same way: one single-node Apache Kafka 4.1.2 (KRaft, from the
jars) with a PLAINTEXT and a SASL_SSL listener (PEM keystore, SCRAM-SHA-512 credentials written
by `kafka-storage.sh format --add-scram`), and two Fluvial brokers, one per listener kind (a
Fluvial broker has one Kafka listener), both with `--flush-policy none`, Kafka's durability
(acknowledged once written to the OS). The certificate is an ECDSA P-256 one made for the run
(tests/support/certs.py); the client is confluent-kafka (librdkafka) with the same settings on
both systems (benchmarks/clients.py: acks=all, linger.ms 5, no compression).

Per round, per system, per protocol: produce N records of S bytes to a fresh topic (records/s
to the last acknowledgement), consume them from the start (records/s from the first batch to
the last), and, on a connection already authenticated, M single-record produce round trips
(linger.ms 0, flush after each: the median and 99th percentile latency). Systems alternate
(Kafka first in even rounds, Fluvial first in odd ones) and so do protocols, so that slow
moments of the shared machine fall on both. A first warm-up round (the JVM's JIT, the page
cache) is run and kept in the file but not counted. Ratios are taken per round pair: Fluvial/Kafka
under each protocol, and each system's SASL_SSL/PLAINTEXT; the medians of those are reported
with the worst pair.

Run: `python benchmarks/bench_security.py [--rounds 3] [--records 100000] [--size 1000]
[--latency-requests 300] [--warmup-rounds 1] [--max-load 3 --max-wait 300]`. Results: benchmarks/results/security.json, with os.getloadavg()
at the start and end of every round. `--quick` is the smoke run the tests use (small sizes,
one round, nothing saved unless --output is given).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer  # noqa: E402

from benchmarks import clients, machine  # noqa: E402
from benchmarks.brokers import FLUVIAL_FLUSH_NONE, RunningBroker, remove_workdir, start_fluvial  # noqa: E402
from benchmarks.secure_kafka import (PLAINTEXT, SASL_SSL, SCRAM_SHA_512, Credentials, SecureKafka,  # noqa: E402
                                     start_secure_kafka)
from tests.support.certs import make_pki  # noqa: E402
from tests.support.secure_broker import add_users, kafka_listener_args  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "security.json"
SYSTEMS = ("kafka", "fluvial")
PROTOCOLS = (PLAINTEXT, SASL_SSL)
USER, PASSWORD = "bench", "bench-secret-1"
PARTITIONS = 1
METRICS = {  # name -> higher is better
    "produce_records_per_s": True,
    "consume_records_per_s": True,
    "latency_p50_ms": False,
    "latency_p99_ms": False,
}


def log(message: str) -> None:
    print(f"[security {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Setup:
    """Kafka (both listeners) and two Fluvial brokers; `target(system, protocol)` says where to connect."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.pki = make_pki(workdir / "pki")
        self.credentials = Credentials(SCRAM_SHA_512, USER, PASSWORD, self.pki.ca)
        self.kafka: SecureKafka | None = None
        self.fluvial: dict[str, RunningBroker] = {}

    def start(self, systems: tuple[str, ...]) -> None:
        if "kafka" in systems:
            log("starting Apache Kafka (PLAINTEXT and SASL_SSL listeners)")
            self.kafka = start_secure_kafka(self.workdir / "kafka", self.pki.server.cert, self.pki.server.key,
                                            {USER: PASSWORD})
        if "fluvial" not in systems:
            return
        log("starting Fluvial (PLAINTEXT)")
        (self.workdir / "fluvial-plaintext").mkdir()
        self.fluvial[PLAINTEXT] = start_fluvial(self.workdir / "fluvial-plaintext", FLUVIAL_FLUSH_NONE)
        log("starting Fluvial (SASL_SSL)")
        workdir = self.workdir / "fluvial-sasl-ssl"
        add_users(workdir / "data", {USER: PASSWORD})   # start_fluvial's data dir
        self.fluvial[SASL_SSL] = start_fluvial(
            workdir, FLUVIAL_FLUSH_NONE, extra_args=kafka_listener_args(self.pki, SASL_SSL, (SCRAM_SHA_512,)),
            client_config=self.credentials.confluent())

    def target(self, system: str, protocol: str) -> tuple[str, dict[str, object]]:
        security = self.credentials.confluent() if protocol == SASL_SSL else {}
        if system == "kafka":
            assert self.kafka is not None
            return self.kafka.bootstrap(protocol), security
        return self.fluvial[protocol].bootstrap, security

    def versions(self) -> dict[str, str]:
        out = {"fluvial": next(iter(self.fluvial.values())).version if self.fluvial else "not started"}
        if self.kafka is not None:
            out["kafka"] = self.kafka.broker.version
        return out

    def stop(self) -> None:
        for broker in self.fluvial.values():
            broker.stop()
        if self.kafka is not None:
            self.kafka.stop()


def small_request_latency(bootstrap: str, security: dict[str, object], topic: str, requests: int) -> dict[str, float]:
    """Single-record acks=all produce round trips on one authenticated connection (the first
    few, connection and metadata set-up included, are left out)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "log_level": 3,
                         **security})
    value = clients.payload(100)
    times = []
    for i in range(requests + 5):
        start = time.perf_counter()
        producer.produce(topic, value)
        if producer.flush(30) != 0:
            raise clients.CaseFailed(f"single-record produce to {topic} not acknowledged within 30 s")
        if i >= 5:
            times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {"latency_p50_ms": statistics.median(times), "latency_p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))]}


def measure(setup: Setup, system: str, protocol: str, records: int, size: int, latency_requests: int,
            timeout_s: float) -> dict[str, float]:
    bootstrap, security = setup.target(system, protocol)
    topic = clients.unique_name(f"sec-{system}-{protocol.lower()}")
    clients.create_topic(bootstrap, topic, PARTITIONS, security=security)
    try:
        produced = clients.produce_confluent(bootstrap, topic, records, size, timeout_s, security=security)
        consumed = clients.consume_confluent(bootstrap, topic, records, PARTITIONS, timeout_s, security=security)
        figures = {"produce_records_per_s": produced.records / produced.seconds,
                   "consume_records_per_s": consumed.records / consumed.seconds}
        if latency_requests:
            figures |= small_request_latency(bootstrap, security, topic, latency_requests)
        return figures
    finally:
        clients.delete_topic(bootstrap, topic, security)


def _summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _ratio_summary(ratios: list[float], higher_is_better: bool) -> dict[str, object] | None:
    summary = _summary(ratios)
    if summary is None:
        return None
    # The worst pair for the numerator: the lowest ratio of a rate, the highest of a latency.
    summary["worst"] = min(ratios) if higher_is_better else max(ratios)
    summary["per_round"] = ratios
    return summary


def summarize(rounds: list[dict], systems: tuple[str, ...] = SYSTEMS) -> tuple[dict, dict]:
    """Medians per system/protocol/metric, and the per-round-pair ratios (warm-up rounds left out)."""
    rounds = [r for r in rounds if not r.get("warmup")]
    medians: dict = {}
    for system in systems:
        for protocol in PROTOCOLS:
            for metric in METRICS:
                values = [r["figures"][system][protocol][metric] for r in rounds
                          if metric in r["figures"].get(system, {}).get(protocol, {})]
                medians.setdefault(system, {}).setdefault(protocol, {})[metric] = _summary(values)
    ratios: dict = {"fluvial_over_kafka": {}, "sasl_ssl_over_plaintext": {}}
    for metric, higher in METRICS.items():
        for protocol in PROTOCOLS:
            pairs = [r["figures"]["fluvial"][protocol][metric] / r["figures"]["kafka"][protocol][metric]
                     for r in rounds if _has(r, "fluvial", protocol, metric) and _has(r, "kafka", protocol, metric)]
            ratios["fluvial_over_kafka"].setdefault(protocol, {})[metric] = _ratio_summary(pairs, higher)
        for system in systems:
            pairs = [r["figures"][system][SASL_SSL][metric] / r["figures"][system][PLAINTEXT][metric]
                     for r in rounds if _has(r, system, SASL_SSL, metric) and _has(r, system, PLAINTEXT, metric)]
            # Here the "worst" is the largest cost of security: the lowest rate ratio, the highest latency one.
            ratios["sasl_ssl_over_plaintext"].setdefault(system, {})[metric] = _ratio_summary(pairs, higher)
    return medians, ratios


def _has(r: dict, system: str, protocol: str, metric: str) -> bool:
    value = r["figures"].get(system, {}).get(protocol, {}).get(metric)
    return value is not None and value > 0


def wait_for_load(max_load: float | None, max_wait_s: float) -> float:
    """Wait (at most `max_wait_s`) until the 1-minute load average is below `max_load`;
    returns the seconds waited. The machine is shared: a round started in a busy minute
    measures the neighbours as much as the brokers."""
    if max_load is None:
        return 0.0
    start = time.monotonic()
    while os.getloadavg()[0] >= max_load and time.monotonic() - start < max_wait_s:
        time.sleep(5)
    return round(time.monotonic() - start, 1)


def run(rounds: int, records: int, size: int, latency_requests: int, timeout_s: float,
        output: Path | None, systems: tuple[str, ...] = SYSTEMS, warmup_rounds: int = 1,
        max_load: float | None = None, max_wait_s: float = 300.0) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="fluvial-bench-security-"))
    setup = Setup(workdir)
    result: dict = {
        "workload": "security",
        "description": "produce/consume throughput and single-record produce latency over SASL_SSL "
                       "(SCRAM-SHA-512, TLS, ECDSA P-256 certificate) and PLAINTEXT, Fluvial and Apache "
                       "Kafka configured alike",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": {"rounds": rounds, "warmup_rounds": warmup_rounds, "max_load": max_load, "records": records, "record_bytes": size, "partitions": PARTITIONS,
                     "latency_requests": latency_requests, "sasl_mechanism": SCRAM_SHA_512,
                     "producer": "confluent-kafka acks=all linger.ms=5 batch.size=1000000 no compression",
                     "fluvial_flush_policy": "none (acknowledged once written to the OS, as Kafka)"},
        "machine": machine.describe(),
        "rounds": [],
        "failures": [],
    }
    try:
        setup.start(systems)
        result["versions"] = setup.versions()
        for round_no in range(warmup_rounds + rounds):
            waited = wait_for_load(max_load, max_wait_s)
            order = systems if round_no % 2 == 0 else tuple(reversed(systems))
            protocols = PROTOCOLS if round_no % 2 == 0 else tuple(reversed(PROTOCOLS))
            entry: dict = {"round": round_no, "warmup": round_no < warmup_rounds, "order": [f"{s}/{p}" for s in order for p in protocols],
                           "waited_for_load_s": waited,
                           "load_average_1m": {"start": round(os.getloadavg()[0], 2)}, "figures": {}}
            for system in order:
                for protocol in protocols:
                    try:
                        figures = measure(setup, system, protocol, records, size, latency_requests, timeout_s)
                    except Exception as exc:  # one failed case is recorded; the others still run
                        result["failures"].append({"round": round_no, "system": system, "protocol": protocol,
                                                   "error": f"{type(exc).__name__}: {exc}"[-2000:]})
                        log(f"round {round_no} {system}/{protocol} failed: {exc}")
                        continue
                    entry["figures"].setdefault(system, {})[protocol] = figures
                    log(f"round {round_no} {system}/{protocol}: " + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items()))
            entry["load_average_1m"]["end"] = round(os.getloadavg()[0], 2)
            result["rounds"].append(entry)
    finally:
        setup.stop()
        remove_workdir(workdir)
    result["load_average_1m"] = {"start": result["rounds"][0]["load_average_1m"]["start"] if result["rounds"] else None,
                                 "end": result["rounds"][-1]["load_average_1m"]["end"] if result["rounds"] else None,
                                 "max": max((v for r in result["rounds"] for v in r["load_average_1m"].values()),
                                            default=None)}
    result["medians"], result["ratios"] = summarize(result["rounds"], systems)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=2) + "\n")
        log(f"saved {output}")
    return result


def report(result: dict) -> str:
    lines = [f"load average (1 min): {result['load_average_1m']}"]
    for system in result["medians"]:
        for protocol in PROTOCOLS:
            m = result["medians"][system][protocol]
            lines.append(f"{system:8} {protocol:10} " + "  ".join(
                f"{k} {v['median']:,.1f}" if v else f"{k} -" for k, v in m.items()))
    for kind, by in result["ratios"].items():
        for key, metrics in by.items():
            lines.append(f"{kind} {key}: " + "  ".join(
                f"{k} {v['median']:.2f} (worst {v['worst']:.2f})" if v else f"{k} -" for k, v in metrics.items()))
    if result["failures"]:
        lines.append(f"{len(result['failures'])} failed cases, first: {result['failures'][0]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds")
    parser.add_argument("--warmup-rounds", type=int, default=1,
                        help="rounds run first and not counted (the JVM's JIT, page cache, TLS session setup)")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--latency-requests", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per produce or consume")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, 2,000 records, 20 round trips")
    parser.add_argument("--max-load", type=float, default=None,
                        help="before each round wait (up to --max-wait s) for the 1-minute load average to drop below this")
    parser.add_argument("--max-wait", type=float, default=300.0)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="kafka,fluvial (default: both)")
    parser.add_argument("--output", type=Path, default=None, help=f"default: {RESULTS} (none with --quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup_rounds, args.records, args.latency_requests, args.timeout = 1, 0, 2000, 20, 60.0
    output = args.output or (None if args.quick else RESULTS)
    systems = tuple(s for s in SYSTEMS if s in args.systems.split(","))
    result = run(args.rounds, args.records, args.size, args.latency_requests, args.timeout, output, systems,
                 args.warmup_rounds, args.max_load, args.max_wait)
    print(report(result))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
