"""Power-loss soak: many broker lives, each killed at a random moment and stripped of every
write it had not fsynced, then restarted and checked.

    python -m benchmarks.power_loss_soak [--trials N] [--seed S]

Per trial (see tests/integration/test_power_loss.py): a confluent-kafka producer and a
consumer run against a broker started with the sync journal; kill -9 after 0.5-1.5 s; the
segments are cut back to what their fsyncs covered (with random torn tails); the broker is
restarted and every partition read back. Counted: records acknowledged (acks=all) or seen
by the consumer that are gone (must be 0 under flush policy `ack`), and logs that are not
an in-order prefix (must be 0 under every policy). Results go to
benchmarks/results/power_loss_soak.json with the load average.

``--case ack/all`` runs one case only; ``--keep-failures DIR`` keeps each failing trial's
directory there (broker log, sync journal, the files before and after the loss, and
trial.json with the acknowledged, seen and surviving records) so it can be replayed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "power_loss_soak.json"
CASES = [("ack", "all"), ("ack", "1"), ("none", "1")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="trials per case (default 10)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--case", action="append", choices=[f"{p}/{a}" for p, a in CASES],
                        help="flush policy/acks to run (repeatable; default all three)")
    parser.add_argument("--keep-failures", type=Path, help="keep each failing trial's files in this directory")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.integration.test_power_loss import check_prefix, run_trial, violations

    rng = random.Random(args.seed)
    load_before = os.getloadavg()
    started = time.monotonic()
    cases = []
    for policy, acks in [c for c in CASES if not args.case or f"{c[0]}/{c[1]}" in args.case]:
        totals = {"trials": 0, "acked": 0, "seen": 0, "survived": 0, "lost_bytes": 0,
                  "seen_lost": 0, "acked_lost": 0, "not_a_prefix": 0}
        for i in range(args.trials):
            tmp = Path(tempfile.mkdtemp(prefix="power-loss-"))
            try:
                trial = run_trial(tmp / "trial", rng, policy, acks, keep_before_loss=args.keep_failures is not None)
                totals["trials"] += 1
                totals["acked"] += len(trial.acked)
                totals["seen"] += len(trial.seen)
                totals["survived"] += len(trial.survived)
                totals["lost_bytes"] += trial.lost_bytes
                found = violations(trial, policy, acks)
                for kind, n in found.items():
                    totals[kind] += n
                try:
                    check_prefix(trial)
                except AssertionError:
                    totals["not_a_prefix"] += 1
                    found["not_a_prefix"] = 1
                print(f"{policy}/acks={acks} trial {i + 1}/{args.trials}: acked {len(trial.acked)}, "
                      f"seen {len(trial.seen)}, survived {len(trial.survived)}, lost {trial.lost_bytes} B"
                      f" ({'; '.join(trial.loss)})", flush=True)
                if any(found.values()) and args.keep_failures is not None:
                    kept = _keep(tmp, args.keep_failures, f"{policy}-{acks}-seed{args.seed}-trial{i + 1}", trial, found)
                    print(f"  violation {found}: kept in {kept}", flush=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        cases.append({"flush_policy": policy, "acks": acks, **totals})
        print(json.dumps(cases[-1]), flush=True)
    result = {
        "benchmark": "power_loss_soak",
        "trials_per_case": args.trials,
        "seed": args.seed,
        "seconds": round(time.monotonic() - started, 1),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "cases": cases,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    failed = any(c["not_a_prefix"] or (c["flush_policy"] == "ack" and (c["seen_lost"] or c["acked_lost"]))
                 for c in cases)
    return 1 if failed else 0


def _keep(tmp: Path, keep_dir: Path, name: str, trial, found: dict[str, int]) -> Path:
    """Move a failing trial's directory to ``keep_dir`` with its records as JSON."""
    keep_dir.mkdir(parents=True, exist_ok=True)
    dest = keep_dir / name
    shutil.move(str(tmp / "trial"), dest)

    def records(found_records: dict) -> list:
        return [[p, o, v.decode(errors="replace")] for (p, o), v in sorted(found_records.items())]

    (dest / "trial.json").write_text(json.dumps({
        "violations": found, "produced": trial.produced, "loss": trial.loss,
        "acked": records(trial.acked), "seen": records(trial.seen), "survived": records(trial.survived),
    }))
    return dest


if __name__ == "__main__":
    sys.exit(main())
