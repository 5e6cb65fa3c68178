"""Request counters stay bounded whatever API keys garbled frames carry."""
from fluvial.broker.metrics import api_name
from fluvial.broker.request_stats import UNKNOWN, RequestStats
from fluvial.protocol.messages import ApiKey


def test_keys_that_name_no_api_are_counted_as_one_unknown_key():
    stats = RequestStats()
    for key in range(-1, 1 << 15, 7):        # what a fuzzer's frames can claim
        stats.observe(key, 0.001)
        stats.failed(key)
        stats.error(key, 2)
    known = {k for k in range(-1, 1 << 15, 7) if k in {int(a) for a in ApiKey}}
    assert set(stats.latency) == known | {UNKNOWN}
    assert set(stats.failures) == known | {UNKNOWN}
    assert {k for k, _ in stats.error_codes} == known | {UNKNOWN}
    assert api_name(UNKNOWN) == "unknown" and api_name(int(ApiKey.PRODUCE)) == "produce"
