"""The typed produce path's conversion (`TypedValueFormat.to_columns`, and the whole Kafka
batch to the stored Arrow batch, `kafka_batches.to_arrow`) of an earlier commit against the
working tree, in alternating processes: CPU ms per batch of 20-field Avro records (5,000 of
about 200 B, 1,000 of about 1 KB), the least of --runs per process (the run the other work
on the machine disturbed least), median over --rounds.

The earlier commit is exported with `git archive` into a temporary folder and its compiled
extensions are built there; each round runs one process per tree, so both see the same
load. Saves results/ab-typed-to-arrow-<label>.json.

    python -m benchmarks.ab_typed_to_arrow --before <commit> --label <name> [--rounds 7] [--runs 15]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
SIZES = ((200, 5000), (1000, 1000))


def measure(runs: int) -> dict:
    """In the process of one tree: the least CPU ms per batch of each step and size."""
    import random

    from benchmarks.avro_records import SCHEMA20, confluent_wire, make_record
    from benchmarks.bench_typed_produce_path import kafka_batch
    from benchmarks.workloads.avro_common import PAD_BY_SIZE
    from fluvial.broker import kafka_batches
    from fluvial.broker.metadata import MetadataStore
    from fluvial.protocol.records import decode_records, parse_batch_header
    from fluvial.schema.codecs import value_codec
    from fluvial.schema.registry import SchemaRegistry, parse_schema
    from fluvial.schema.value_format import TypedValueFormat

    def cpu_ms(fn) -> float:
        times = []
        for _ in range(runs):
            t = time.process_time()
            fn()
            times.append(time.process_time() - t)
        return 1000 * min(times)

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        registry = SchemaRegistry(MetadataStore(os.path.join(tmp, "meta.db")))
        sid = registry.register("bench-value", parse_schema(json.dumps(SCHEMA20)))[0]
        fmt = TypedValueFormat(value_codec(registry, "bench"))
        for size, n in SIZES:
            rng = random.Random(size)
            raw = kafka_batch(confluent_wire(SCHEMA20, sid, [make_record(rng, i, PAD_BY_SIZE[size]) for i in range(n)]))
            view, header = memoryview(raw), parse_batch_header(raw)
            values = decode_records(view, header).values
            fmt.to_columns(values)
            out[str(size)] = {"to_columns": cpu_ms(lambda: fmt.to_columns(values)),
                              "to_arrow": cpu_ms(lambda: kafka_batches.to_arrow(view, header, value_format=fmt))}
    return out


def export(commit: str, into: Path) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=into, check=True,
                   capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="the earlier commit")
    ap.add_argument("--label", default="last", help="names the results file: what the change is")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one tree's process
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.runs)))
        return
    if not args.before:
        ap.error("--before is required")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        export(args.before, Path(tmp))
        trees = {"before": Path(tmp), "after": ROOT}
        rounds: dict[str, list[dict]] = {label: [] for label in trees}
        for _ in range(args.rounds):
            for label, tree in trees.items():
                # This file measures in both trees (the earlier one may not have it); -P: the
                # tree on PYTHONPATH is what `fluvial` and `benchmarks` import from.
                proc = subprocess.run([sys.executable, "-P", __file__, "--measure", "--runs", str(args.runs)],
                                      cwd=tree, check=True, capture_output=True, text=True,
                                      env={**os.environ, "PYTHONPATH": str(tree)})
                rounds[label].append(json.loads(proc.stdout))
    result: dict = {"workload": "ab-typed-to-arrow", "before": args.before,
                    "after": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                            text=True).stdout.strip() + " + working tree",
                    "rounds": args.rounds, "runs": args.runs, "loadavg_before": load_before,
                    "loadavg": os.getloadavg(), "cpu_ms_per_batch": {}}
    for size, n in SIZES:
        for step in ("to_columns", "to_arrow"):
            b = statistics.median(r[str(size)][step] for r in rounds["before"])
            a = statistics.median(r[str(size)][step] for r in rounds["after"])
            result["cpu_ms_per_batch"][f"{size}_{step}"] = {"records": n, "before": round(b, 3), "after": round(a, 3),
                                                           "change_pct": round(100 * (a - b) / b, 1)}
    (RESULTS / f"ab-typed-to-arrow-{args.label}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
