"""`python -m benchmarks run [WORKLOAD...] [--quick] [--rounds N]`: Fluvial and Apache Kafka side by side."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from benchmarks import brokers, kafka_dist, machine, report, runner
from benchmarks.brokers import KafkaFrom
from benchmarks.workloads import Scale, all_workloads
from fluvial.progress import cli_progress

DEFAULT_RESULTS = Path(__file__).resolve().parent / "results"
FULL_ROUNDS = 4    # 1 warm-up + 3 counted
QUICK_ROUNDS = 2   # 1 warm-up + 1 counted
WARMUP_ROUNDS = 1


def _parser() -> argparse.ArgumentParser:
    workloads = all_workloads()
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run workloads on Fluvial and Apache Kafka and write the results")
    run.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                     help=f"any of {', '.join(workloads)} (default: all)")
    run.add_argument("--quick", action="store_true", help="small data and 1 counted round: a CI smoke test")
    run.add_argument("--rounds", type=int, help=f"rounds including {WARMUP_ROUNDS} warm-up "
                                                f"(default {FULL_ROUNDS}, quick {QUICK_ROUNDS})")
    run.add_argument("--systems", default=",".join(s.name for s in brokers.ALL_SYSTEMS),
                     help="comma-separated systems to run (default: all)")
    run.add_argument("--kafka-from", choices=[k.value for k in KafkaFrom], default=KafkaFrom.JARS.value,
                     help="Apache Kafka from Maven Central jars (default) or a Docker image via testcontainers")
    run.add_argument("--partitions", type=int, default=1, help="partitions per topic (default 1)")
    run.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS)
    sub.add_parser("list", help="list the workloads")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    workloads = all_workloads()
    if args.command == "list":
        for workload in workloads.values():
            print(f"{workload.name}: {workload.description}")
        return 0

    unknown = [w for w in args.workloads if w not in workloads]
    if unknown:
        print(f"unknown workload(s): {', '.join(unknown)}; known: {', '.join(workloads)}", file=sys.stderr)
        return 2
    chosen = [workloads[w] for w in (args.workloads or workloads)]
    by_name = {s.name: s for s in brokers.ALL_SYSTEMS}
    system_names = [s.strip() for s in args.systems.split(",") if s.strip()]
    if any(s not in by_name for s in system_names) or runner.BASELINE not in system_names:
        print(f"--systems takes names from {', '.join(by_name)} and must include {runner.BASELINE}",
              file=sys.stderr)
        return 2
    systems = [by_name[s] for s in system_names]
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else FULL_ROUNDS)
    warmup = WARMUP_ROUNDS if rounds > WARMUP_ROUNDS else 0
    kafka_from = KafkaFrom(args.kafka_from)

    if kafka_from is KafkaFrom.DOCKER and not brokers.docker_available():
        print("skipped: --kafka-from docker needs a Docker engine and none answers here "
              "(the default, --kafka-from jars, needs none)", file=sys.stderr)
        return 0
    if kafka_from is KafkaFrom.JARS:
        runner.log(f"Apache Kafka {kafka_dist.KAFKA_VERSION} jars: {kafka_dist.fetch()}")

    command = "python -m benchmarks " + " ".join(shlex.quote(a) for a in argv)
    scale = Scale(quick=args.quick, partitions=args.partitions)
    host = machine.describe()
    workdir = brokers.make_workdir()
    fleet = runner.Fleet(systems, workdir, kafka_from)
    started = time.monotonic()
    steps = sum(len(w.cases(scale)) for w in chosen) * rounds * len(systems)
    try:
        with cli_progress("benchmarks", steps, "runs") as bar:
            for workload in chosen:
                bar.update(description=f"benchmarks: {workload.name}")
                result = runner.run_workload(workload, fleet, systems, scale, rounds, warmup, command, host,
                                             on_step=bar.advance)
                path = report.write_workload_json(args.results_dir, result.to_json())
                runner.log(f"wrote {path}")
    finally:
        fleet.stop_all()
        brokers.remove_workdir(workdir)
    results = report.load_results(args.results_dir, order=list(workloads))
    runner.log(f"wrote {report.write_markdown(args.results_dir, results)}")
    runner.log(f"wrote {report.write_chart(args.results_dir, results)}")
    runner.log(f"done in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
