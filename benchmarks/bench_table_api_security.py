"""What TLS, authentication and ACL checks cost on the table API and the HTTP port.

Two brokers (child processes), one open (plain gRPC/HTTP, no users, no authorizer) and one
secured (TLS on both ports, basic auth, the authorizer on with one ACL per operation used),
measured the same way, alternating, `--runs` times:
  - table API `describe` round trip (p50 over `--calls` calls; bearer token per call),
  - table API scan of `--rows` rows (2 columns) on one bucket: rows per second,
  - registry `GET /subjects/{s}/versions/latest` round trip (keep-alive session; p50),
and once, in this process, the cost of a password check the SCRAM way: the first one (what
a request with credentials the user store has not seen pays) and a remembered one. Loopback; client and broker on one machine.
Saves benchmarks/results/table_api_security.json.

    python -m benchmarks.bench_table_api_security [--rows 1000000] [--calls 300] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import requests

import fluvial.client as fc
from benchmarks import machine
from fluvial.security.acls import AclOperation as Op
from fluvial.security.config import SecurityConfig
from tests.support.certs import make_pki
from tests.support.secured_broker import SecuredBroker, tls_security

RESULTS = Path(__file__).parent / "results" / "table_api_security.json"
SCHEMA = pa.schema([("id", pa.int64()), ("amount", pa.float64())])
AVRO = json.dumps({"type": "record", "name": "T", "fields": [{"name": "id", "type": "long"}]})
USER, PASSWORD = "bench", "bench-secret"


def measure(broker: SecuredBroker, secured: bool, pki, rows: int, calls: int) -> dict:
    kwargs = dict(username=USER, password=PASSWORD, tls_root_certs=str(pki.ca)) if secured else {}
    session = requests.Session()
    # verify per request: a session's own setting loses to $REQUESTS_CA_BUNDLE
    verify = str(pki.ca) if secured else True
    if secured:
        session.auth = (USER, PASSWORD)
    with fc.connect(broker.flight_url, **kwargs) as client:
        t = client.table("bench")
        latencies = []
        for _ in range(calls):
            s = time.perf_counter()
            client.describe("bench")
            latencies.append(time.perf_counter() - s)
        scans = []
        for _ in range(3):  # the first warms the page cache; the median of three counts
            s = time.perf_counter()
            assert t.scan().to_arrow().num_rows == rows
            scans.append(time.perf_counter() - s)
        scan_s = statistics.median(scans)
    url = f"{broker.http_url}/subjects/bench_schema-value/versions/latest"
    session.get(url, timeout=10, verify=verify).raise_for_status()
    http = []
    for _ in range(calls):
        s = time.perf_counter()
        session.get(url, timeout=10, verify=verify).raise_for_status()
        http.append(time.perf_counter() - s)
    return {"describe_p50_ms": statistics.median(latencies) * 1000, "scan_rows_per_s": rows / scan_s,
            "registry_get_p50_ms": statistics.median(http) * 1000}


def password_check_ms(tmp: Path) -> tuple[float, float]:
    """(first check of a password, a check the user store remembered), milliseconds."""
    from fluvial.security.users import UserStore

    first, again = [], []
    for i in range(5):
        store = UserStore.in_data_dir(tmp / str(i))
        store.set_password(USER, PASSWORD)
        s = time.perf_counter()
        assert store.verify_password(USER, PASSWORD)
        first.append(time.perf_counter() - s)
        s = time.perf_counter()
        assert store.verify_password(USER, PASSWORD)
        again.append(time.perf_counter() - s)
    return statistics.median(first) * 1000, statistics.median(again) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        pki = make_pki(tmp / "pki")
        secured_cfg = tls_security(pki, http_tls=True, http_auth="basic", flight_tls=True, flight_auth="basic",
                                   authorizer=True)
        brokers = {"open": SecuredBroker(tmp / "open", SecurityConfig(), {}).start(),
                   "secured": SecuredBroker(tmp / "secured", secured_cfg, {USER: PASSWORD}).start()}
        try:
            brokers["secured"].allow(USER, Op.CREATE, "bench")
            brokers["secured"].allow(USER, Op.READ, "bench")
            brokers["secured"].allow(USER, Op.WRITE, "bench")
            brokers["secured"].allow(USER, Op.WRITE, "bench_schema")
            data = pa.table({"id": np.arange(args.rows), "amount": np.random.default_rng(1).random(args.rows)})
            for name, b in brokers.items():
                kwargs = dict(username=USER, password=PASSWORD, tls_root_certs=str(pki.ca)) if name == "secured" else {}
                with fc.connect(b.flight_url, **kwargs) as client:
                    client.create_table("bench", SCHEMA).append(data)
                auth = (USER, PASSWORD) if name == "secured" else None
                requests.post(f"{b.http_url}/subjects/bench_schema-value/versions", json={"schema": AVRO}, auth=auth,
                              verify=str(pki.ca) if name == "secured" else True, timeout=10).raise_for_status()
            runs: dict[str, list[dict]] = {"open": [], "secured": []}
            for _ in range(args.runs):
                for name, b in brokers.items():  # alternating, so a load change hits both
                    runs[name].append(measure(b, name == "secured", pki, args.rows, args.calls))
        finally:
            for b in brokers.values():
                b.stop()
        first_ms, again_ms = password_check_ms(tmp / "users")
    out: dict = {"benchmark": "table-api-security", "rows": args.rows, "calls": args.calls, "runs": args.runs}
    for name, rs in runs.items():
        out[name] = {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]}
        out[name]["runs"] = [{k: round(v, 3) for k, v in r.items()} for r in rs]
    out["password_check_first_ms"] = round(first_ms, 3)
    out["password_check_remembered_ms"] = round(again_ms, 4)
    out["load_average_1m"] = round(os.getloadavg()[0], 2)
    out["machine"] = machine.describe()
    print(json.dumps({k: v for k, v in out.items() if k != "machine"}, indent=1))
    if not args.no_save:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
