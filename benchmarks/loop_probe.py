"""How long a broker keeps other clients waiting: a client that pings it all the time.

`ResponsivenessProbe` sends a tiny ApiVersions request over its own connection, waits for
the answer, sleeps a few milliseconds and starts again, recording every round trip. While
something else happens on the broker (a 200-partition topic being created, a flood of
producers), the longest round trip is how long the broker's event loop was blocked for
everyone, as a client sees it.
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np

from fluvial.protocol.messages import ApiKey, encode_request

_SIZE = struct.Struct(">i")


@dataclass(frozen=True)
class ProbeReport:
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    # The round trips over 20 ms, with the time they ended (seconds since the probe started).
    slow: tuple[tuple[float, float], ...]

    def as_dict(self) -> dict:
        return {"samples": self.samples, "p50_ms": round(self.p50_ms, 2), "p99_ms": round(self.p99_ms, 2),
                "max_ms": round(self.max_ms, 2), "slow": [(round(t, 3), round(ms, 1)) for t, ms in self.slow]}


class ResponsivenessProbe:
    """Round trips of ApiVersions v0 on one connection, from a thread, until `stop()`."""

    def __init__(self, bootstrap: str, interval_s: float = 0.002):
        host, port = bootstrap.rsplit(":", 1)
        self._address = (host, int(port))
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._latencies: list[tuple[float, float]] = []
        self._thread = threading.Thread(target=self._run, name="responsiveness-probe", daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> "ResponsivenessProbe":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._sock = socket.create_connection(self._address, timeout=30)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._t0 = time.perf_counter()
        self._thread.start()

    def stop(self) -> ProbeReport:
        self._stop.set()
        self._thread.join(60)
        self._sock.close()
        if self._error is not None:
            raise RuntimeError(f"the probe's connection failed: {self._error!r}") from self._error
        return self.report()

    def report(self) -> ProbeReport:
        lat = np.array([ms for _, ms in self._latencies]) if self._latencies else np.zeros(1)
        slow = tuple((t, ms) for t, ms in self._latencies if ms > 20)
        return ProbeReport(len(self._latencies), float(np.percentile(lat, 50)), float(np.percentile(lat, 99)),
                           float(lat.max()), slow)

    def _run(self) -> None:
        correlation = 0
        try:
            while not self._stop.is_set():
                correlation += 1
                request = encode_request(ApiKey.API_VERSIONS, 0, correlation, {}, client_id="probe")
                start = time.perf_counter()
                self._sock.sendall(request)
                (size,) = _SIZE.unpack(_read_exactly(self._sock, 4))
                _read_exactly(self._sock, size)
                end = time.perf_counter()
                self._latencies.append((end - self._t0, (end - start) * 1000))
                time.sleep(self._interval_s)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self._error = exc


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("the broker closed the probe's connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
