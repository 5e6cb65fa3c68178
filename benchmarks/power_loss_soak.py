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
"""
from __future__ import annotations

import argparse
import json
import os
import random
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
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.integration.test_power_loss import check_prefix, run_trial, violations

    rng = random.Random(args.seed)
    load_before = os.getloadavg()
    started = time.monotonic()
    cases = []
    for policy, acks in CASES:
        totals = {"trials": 0, "acked": 0, "seen": 0, "survived": 0, "lost_bytes": 0,
                  "seen_lost": 0, "acked_lost": 0, "not_a_prefix": 0}
        for i in range(args.trials):
            with tempfile.TemporaryDirectory(prefix="power-loss-") as tmp:
                trial = run_trial(Path(tmp) / "trial", rng, policy, acks)
            totals["trials"] += 1
            totals["acked"] += len(trial.acked)
            totals["seen"] += len(trial.seen)
            totals["survived"] += len(trial.survived)
            totals["lost_bytes"] += trial.lost_bytes
            for kind, n in violations(trial, policy, acks).items():
                totals[kind] += n
            try:
                check_prefix(trial)
            except AssertionError:
                totals["not_a_prefix"] += 1
            print(f"{policy}/acks={acks} trial {i + 1}/{args.trials}: acked {len(trial.acked)}, "
                  f"seen {len(trial.seen)}, survived {len(trial.survived)}, lost {trial.lost_bytes} B", flush=True)
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


if __name__ == "__main__":
    sys.exit(main())
