"""kafka_auth: what a new Kafka connection costs to set up under each security protocol.

For each setting a broker process is started (`--flush-policy none`) and a raw client opens
`--connections` connections one after another, each: connect (and TLS handshake), SASL
handshake and authentication when the protocol has SASL, then one ApiVersions round trip;
the figure is the time from connect to the ApiVersions answer (median and 99th percentile,
milliseconds). The SCRAM client's own PBKDF2 (salting the password, as any client does) is
part of that time; it is also measured alone (`client_pbkdf2_ms`). Settings alternate within
each round so that slow moments of the shared machine fall on all of them; the medians over
rounds are reported with the load average.

Also measured in-process: `verify_password` (what PLAIN and basic auth cost the broker per
check: PBKDF2 with the stored iterations, or a cache hit).

Run: `python benchmarks/bench_kafka_auth.py [--rounds 3] [--connections 100]`.
Results: benchmarks/results/kafka_auth.json.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import machine  # noqa: E402

PASSWORD = "bench-secret"
SETTINGS = [
    ("PLAINTEXT", None),
    ("SASL_PLAINTEXT", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
    ("SSL", None),
    ("SASL_SSL", "SCRAM-SHA-512"),
]


def _call(sock, api_key: int, version: int, body: dict, cid: int):
    from fluvial.protocol.messages import decode_response, encode_request
    sock.sendall(encode_request(api_key, version, cid, body))
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the broker")
        buf += chunk
    return decode_response(api_key, version, buf[4:])[1]


def _scram(sock, mechanism: str) -> None:
    digest = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    bare = f"n=bench,r={base64.b64encode(os.urandom(18)).decode()}"
    first = _call(sock, 36, 2, {"auth_bytes": ("n,," + bare).encode()}, 2)
    sfirst = first.auth_bytes.decode()
    attrs = dict(a.split("=", 1) for a in sfirst.split(","))
    salted = hashlib.pbkdf2_hmac(digest, PASSWORD.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    ck = hmac.new(salted, b"Client Key", digest).digest()
    wp = f"c=biws,r={attrs['r']}"
    sig = hmac.new(hashlib.new(digest, ck).digest(), f"{bare},{sfirst},{wp}".encode(), digest).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(ck, sig))).decode()
    final = _call(sock, 36, 2, {"auth_bytes": f"{wp},p={proof}".encode()}, 3)
    assert final.error_code == 0, final


def connect_once(port: int, protocol: str, mechanism: str | None, ctx: ssl.SSLContext | None) -> float:
    t0 = time.perf_counter()
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock = ctx.wrap_socket(raw, server_hostname="localhost") if ctx is not None else raw
    try:
        if mechanism:
            assert _call(sock, 17, 1, {"mechanism": mechanism}, 1).error_code == 0
            if mechanism == "PLAIN":
                assert _call(sock, 36, 2, {"auth_bytes": f"\0bench\0{PASSWORD}".encode()}, 2).error_code == 0
            else:
                _scram(sock, mechanism)
        assert _call(sock, 18, 0, {}, 4).error_code == 0
        return (time.perf_counter() - t0) * 1000
    finally:
        sock.close()


def main() -> None:
    from tests.support.broker_process import BrokerProcess
    from tests.support.certs import make_pki

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--connections", type=int, default=100)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "kafka_auth.json")
    args = p.parse_args()
    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-auth-"))
    pki = make_pki(work / "pki")
    tls = ["--ssl-certificate-location", str(pki.server.cert), "--ssl-key-location", str(pki.server.key)]
    brokers = {}
    for protocol in sorted({s[0] for s in SETTINGS}):
        brokers[protocol] = BrokerProcess(work / protocol, "--security-protocol", protocol, "--flush-policy", "none",
                                          "--user", f"bench={PASSWORD}", *tls).start()
    client_ctx = ssl.create_default_context(cafile=str(pki.ca))
    samples: dict[str, list[list[float]]] = {f"{p}/{m or '-'}": [] for p, m in SETTINGS}
    try:
        for rnd in range(args.rounds):
            order = SETTINGS if rnd % 2 == 0 else list(reversed(SETTINGS))
            for protocol, mechanism in order:
                ctx = client_ctx if "SSL" in protocol else None
                times = [connect_once(brokers[protocol].port, protocol, mechanism, ctx)
                         for _ in range(args.connections)]
                samples[f"{protocol}/{mechanism or '-'}"].append(times)
    finally:
        for b in brokers.values():
            b.stop()

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    results = {}
    for key, rounds in samples.items():
        results[key] = {"median_ms": round(statistics.median(statistics.median(r) for r in rounds), 3),
                        "p99_ms": round(statistics.median(pct(r, 0.99) for r in rounds), 3)}

    from fluvial.security import scram
    from fluvial.security.users import UserStore
    store = UserStore(work / "users.json")
    store.set_password("u", PASSWORD)
    store.verify_password("u", PASSWORD)
    t0 = time.perf_counter()
    for _ in range(1000):
        store.verify_password("u", PASSWORD)
    cached_us = (time.perf_counter() - t0) / 1000 * 1e6
    t0 = time.perf_counter()
    for _ in range(20):
        store.verify_password("u", "wrong")  # never cached: PBKDF2 under each stored mechanism
    uncached_ms = (time.perf_counter() - t0) / 20 * 1000
    pbkdf2 = {m: round(min(_timed(lambda: hashlib.pbkdf2_hmac(d, b"pw", b"s" * 32, scram.DEFAULT_ITERATIONS))
                             for _ in range(5)) * 1000, 3)
              for m, (d, _) in scram.MECHANISMS.items()}
    out = {"benchmark": "kafka_auth", "connections_per_round": args.connections, "rounds": args.rounds,
           "setup_time": results, "client_pbkdf2_ms": pbkdf2, "iterations": scram.DEFAULT_ITERATIONS,
           "verify_password_cached_us": round(cached_us, 2),
           "verify_password_wrong_ms": round(uncached_ms, 3),
           "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "machine": machine.describe()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
