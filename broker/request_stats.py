"""What the Kafka listener counts per API: requests, their latency, failures and error codes.

Plain counters on the event loop thread; the metrics collector reads them when scraped.
"""
from __future__ import annotations

from collections import Counter

from fluvial.broker.latency import REQUEST_BOUNDS, LatencyStats
from fluvial.protocol.messages import ApiKey

# Requests are counted under their API key only when it names a Kafka API: a garbled frame
# can carry any of 65,536 keys, and counting each would grow these maps (and the metric
# labels) without bound. Every other key is counted as UNKNOWN.
UNKNOWN = -1
_KNOWN = frozenset(int(k) for k in ApiKey)


def _key(api_key: int) -> int:
    return api_key if api_key in _KNOWN else UNKNOWN


class RequestStats:
    def __init__(self) -> None:
        self.latency: dict[int, LatencyStats] = {}
        # Requests whose handling failed: the connection was closed instead of answered.
        self.failures: Counter[int] = Counter()
        # Error codes in answers, per (API key, error code), as handlers report them.
        self.error_codes: Counter[tuple[int, int]] = Counter()

    def observe(self, api_key: int, seconds: float) -> None:
        api_key = _key(api_key)
        stats = self.latency.get(api_key)
        if stats is None:
            stats = self.latency[api_key] = LatencyStats(REQUEST_BOUNDS)
        stats.observe(seconds)

    def failed(self, api_key: int) -> None:
        self.failures[_key(api_key)] += 1

    def error(self, api_key: int, code: int) -> None:
        self.error_codes[(_key(api_key), code)] += 1
