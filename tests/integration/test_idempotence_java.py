"""The Java producer (idempotent by default) through a proxy that cuts connections mid-request."""
from __future__ import annotations

import subprocess

import pytest

from tests.integration.test_idempotence import (PROXY_HOST, ResponseDroppingProxy, assert_exactly_once_in_order,
                                                create_topic, needs_alias, read_all)

pytestmark = pytest.mark.java


@needs_alias
def test_java_producer_survives_cut_connections_without_duplicates(fresh_broker, java_tools, topic_name):
    broker = fresh_broker("--advertised-host", PROXY_HOST)
    n = 5000
    with ResponseDroppingProxy(PROXY_HOST, broker.port, ("127.0.0.1", broker.port), every=6) as proxy:
        create_topic(broker.bootstrap, topic_name, 1)
        proxy.cutting = True
        lines = "".join(f"v-{i}\n" for i in range(n)).encode()
        # No idempotence setting given: the Java producer's default (on since 3.0) is what is tested.
        cmd = java_tools.java_tool(
            "org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", f"{PROXY_HOST}:{broker.port}",
            "--topic", topic_name, "--producer-property", "acks=all",
            "--producer-property", "linger.ms=2", "--producer-property", "batch.size=2048",
            "--producer-property", "request.timeout.ms=5000", "--producer-property", "delivery.timeout.ms=120000",
            "--producer-property", "retry.backoff.ms=50")
        res = subprocess.run(cmd, input=lines, capture_output=True, timeout=180)
        assert res.returncode == 0, res.stderr.decode()[-3000:]
        proxy.cutting = False
        assert proxy.cut >= 3, f"only {proxy.cut} of {proxy.produce_responses} produce responses were cut"
        got = read_all(broker.bootstrap, topic_name, 1, n)
    assert_exactly_once_in_order(got, n, 1)
