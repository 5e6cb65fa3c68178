"""benchmarks/bench_security.py end to end in --quick mode: Apache Kafka with a SASL_SSL
listener and Fluvial brokers, SCRAM-SHA-512 over TLS against PLAINTEXT (figures not asserted)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.kafka_dist import REPO_ROOT

pytestmark = pytest.mark.java


@pytest.mark.skipif(shutil.which("java") is None, reason="Apache Kafka needs java")
@pytest.mark.timeout(600)
def test_security_benchmark_quick_run_measures_both_systems_and_protocols(java_tools, tmp_path: Path) -> None:
    out = tmp_path / "security.json"
    done = subprocess.run([sys.executable, "benchmarks/bench_security.py", "--quick", "--output", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stderr[-4000:]
    data = json.loads(out.read_text())
    assert data["failures"] == [] and len(data["rounds"]) == 1
    figures = data["rounds"][0]["figures"]
    for system in ("kafka", "fluvial"):
        for protocol in ("PLAINTEXT", "SASL_SSL"):
            assert figures[system][protocol]["produce_records_per_s"] > 0
            assert figures[system][protocol]["consume_records_per_s"] > 0
            assert 0 < figures[system][protocol]["latency_p50_ms"] <= figures[system][protocol]["latency_p99_ms"]
    assert data["ratios"]["fluvial_over_kafka"]["SASL_SSL"]["produce_records_per_s"]["n"] == 1
    assert data["ratios"]["sasl_ssl_over_plaintext"]["fluvial"]["consume_records_per_s"]["median"] > 0
    assert set(data["load_average_1m"]) == {"start", "end", "max"}
