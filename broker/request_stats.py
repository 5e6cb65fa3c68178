"""What the Kafka listener counts per API: requests, their latency, failures and error codes.

Plain counters on the event loop thread; the metrics collector reads them when scraped.
"""
from __future__ import annotations

from collections import Counter

from fluvial.broker.latency import REQUEST_BOUNDS, LatencyStats


class RequestStats:
    def __init__(self) -> None:
        self.latency: dict[int, LatencyStats] = {}
        # Requests whose handling failed: the connection was closed instead of answered.
        self.failures: Counter[int] = Counter()
        # Error codes in answers, per (API key, error code), as handlers report them.
        self.error_codes: Counter[tuple[int, int]] = Counter()

    def observe(self, api_key: int, seconds: float) -> None:
        stats = self.latency.get(api_key)
        if stats is None:
            stats = self.latency[api_key] = LatencyStats(REQUEST_BOUNDS)
        stats.observe(seconds)

    def failed(self, api_key: int) -> None:
        self.failures[api_key] += 1

    def error(self, api_key: int, code: int) -> None:
        self.error_codes[(api_key, code)] += 1
