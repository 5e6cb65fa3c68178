"""authorizer: what an ACL check costs a request, in-process.

Three figures, each the median of several runs (nanoseconds per check):
- `disabled_ns`: the check every handler makes with the authorizer off (one attribute test
  through `broker.authorization.allowed`);
- `cached_ns`: a decision already made for this (principal, host, operation, resource);
- `uncached_ns`: a decision computed from the ACLs (the cache emptied before each call), with
  `--acls` bindings of which half are prefixed patterns.

Run: `python benchmarks/bench_authorizer.py [--acls 2000] [--rounds 5]`.
Results: benchmarks/results/authorizer.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import machine  # noqa: E402


def per_call_ns(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e9


def main() -> None:
    from fluvial.broker.authorization import allowed
    from fluvial.security.acls import AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
    from fluvial.security.authorizer import Authorizer
    from fluvial.security.config import SecurityConfig
    from fluvial.security.principal import Principal

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--acls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=200_000)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "authorizer.json")
    args = p.parse_args()
    loadavg_start = os.getloadavg()

    half = args.acls // 2
    bindings = [AclBinding.of(ResourceType.TOPIC, f"team{i}.", PatternType.PREFIXED, f"User:u{i % 50}", "*",
                              AclOperation.WRITE, AclPermissionType.ALLOW) for i in range(half)]
    bindings += [AclBinding.of(ResourceType.TOPIC, f"topic{i}", PatternType.LITERAL, f"User:u{i % 50}", "*",
                               AclOperation.READ, AclPermissionType.ALLOW) for i in range(args.acls - half)]
    on = Authorizer(SecurityConfig(authorizer=True), bindings)
    off = Authorizer(SecurityConfig(authorizer=False))
    principal = Principal.user("u7")
    ctx_off = SimpleNamespace(broker=SimpleNamespace(authorizer=off), principal=principal, peer="10.0.0.7:50000")
    ctx_on = SimpleNamespace(broker=SimpleNamespace(authorizer=on), principal=principal, peer="10.0.0.7:50000")
    W, T = AclOperation.WRITE, ResourceType.TOPIC
    assert allowed(ctx_on, W, T, "team7.orders") and not allowed(ctx_on, W, T, "team8.orders")

    def uncached():
        on._snap.cache.clear()
        on.authorize(principal, "10.0.0.7", W, T, "team7.orders")

    rounds = {"disabled_ns": [], "cached_ns": [], "uncached_ns": []}
    for _ in range(args.rounds):
        rounds["disabled_ns"].append(per_call_ns(lambda: allowed(ctx_off, W, T, "team7.orders"), args.calls))
        rounds["cached_ns"].append(per_call_ns(lambda: allowed(ctx_on, W, T, "team7.orders"), args.calls))
        rounds["uncached_ns"].append(per_call_ns(uncached, args.calls // 10))
    result = {"workload": "authorizer", "machine": machine.describe(), "loadavg_start": loadavg_start,
              "acls": args.acls, "prefixed_acls": half, "rounds": rounds,
              **{k: round(statistics.median(v), 1) for k, v in rounds.items()},
              "loadavg_end": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine", "rounds")}))


if __name__ == "__main__":
    main()
