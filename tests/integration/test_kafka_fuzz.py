"""Mutations of real clients' requests (tests/fixtures/kafka_requests.bin, recorded by
`python -m benchmarks.kafka_fuzz record`) never make the broker fail: no traceback or
internal error in its log, other clients keep getting answers, memory stays flat. The
registry and the table API get a short round of their own. A longer soak:
`python -m benchmarks.kafka_fuzz soak`."""
from __future__ import annotations

import struct

import pytest

from benchmarks.kafka_fuzz import CORPUS, TABLE_SHAPING_APIS, fuzz, fuzz_flight, fuzz_registry, read_frames


@pytest.fixture
def fuzzed_broker(fresh_broker):
    return fresh_broker()


def test_mutated_client_requests_never_break_the_broker(fuzzed_broker):
    corpus = read_frames(CORPUS.read_bytes())
    assert len(corpus) > 50 and len({f[:2] for f in corpus}) > 20  # many requests of many APIs
    report = fuzz(fuzzed_broker, corpus, seconds=30, workers=3)
    print(report)
    assert report.requests > 1000, report
    assert report.failures == [], "\n".join(report.failures)
    # A probe asking every 50 ms was answered throughout, never held up for long.
    assert report.probe_samples > 150 and report.probe_max_ms < 3000, report
    assert report.outcomes.get("answered", 0) > 100 and report.outcomes.get("closed by broker", 0) > 100
    # Creating a table of up to 10,000 buckets moves the allocator's high-water mark by up to
    # ~60-130 MB in one step (runs grow 30-144 MB in all, whether the listener's socket I/O
    # runs on asyncio or on the compiled thread): a loose bound here, the leak check is the
    # steady passes below.
    assert report.rss_end_mb - report.rss_start_mb < 200, report
    # Flat memory once the fuzzer no longer makes the broker create and drop tables of up to
    # 10,000 buckets (which moves the allocator's high-water mark, see docs/architecture.md).
    # The broker's memory climbs to a plateau (the allocators' high-water marks; ~320 MB
    # here, reached during the churn above in most runs, in one or two of the passes below
    # in others), then stays there: a pass of steady requests must soon grow by under
    # 12 MB. A leak per request grows every pass alike (30,000 requests a pass: a leak of
    # 400 bytes per request or more fails).
    steady_apis = [f for f in corpus if struct.unpack(">h", f[:2])[0] not in TABLE_SHAPING_APIS]
    passes = []
    for seed in range(2, 6):
        steady = fuzz(fuzzed_broker, steady_apis, seconds=10, workers=3, seed=seed)
        print(steady)
        assert steady.failures == [], "\n".join(steady.failures)
        assert steady.requests > 500, steady
        passes.append(steady.rss_end_mb - steady.rss_start_mb)
        if passes[-1] < 12:
            break
    assert passes[-1] < 12, f"memory grew in every steady pass (MB): {passes}"
    assert fuzzed_broker.alive()


def test_registry_and_table_api_take_garbage(fuzzed_broker):
    statuses = fuzz_registry(fuzzed_broker.http_url, seconds=5)
    assert sum(statuses.values()) > 50
    assert not [s for s in statuses if s >= 500], statuses
    outcomes = fuzz_flight(fuzzed_broker.flight_url, seconds=5)
    assert outcomes.get("refused", 0) > 20 and "internal error" not in outcomes, outcomes
    log = fuzzed_broker.log_path.read_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
