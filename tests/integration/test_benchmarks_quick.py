"""The benchmark harness end to end in --quick mode: real Apache Kafka from the jars, real Fluvial brokers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.brokers import docker_available
from benchmarks.workloads.e2e_latency import FSYNCS_PER_S, SLOW_FSYNCS
from benchmarks.kafka_dist import REPO_ROOT

WORKLOADS = ("produce-raw", "consume-raw", "e2e-latency")
# Figures only Fluvial has (read from its /metrics): Kafka's column stays empty.
FLUVIAL_ONLY = {FSYNCS_PER_S.name, SLOW_FSYNCS.name}


@pytest.mark.skipif(docker_available(), reason="a Docker engine answers here: the skip path is not taken")
def test_kafka_from_docker_without_engine_skips_cleanly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "--quick", "--kafka-from", "docker",
         "--results-dir", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stderr and "Docker" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.java
@pytest.mark.skipif(shutil.which("java") is None or shutil.which("mvn") is None,
                    reason="Apache Kafka needs java, and mvn to fetch its jars")
@pytest.mark.timeout(900)
def test_quick_run_writes_json_markdown_and_chart_for_both_systems(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "--quick", "--results-dir", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=880,
    )
    assert done.returncode == 0, done.stderr[-4000:]

    for workload in WORKLOADS:
        data = json.loads((tmp_path / f"{workload}.json").read_text())
        assert data["mode"] == "quick" and data["warmup_rounds"] == 1
        assert {s["name"] for s in data["systems"]} == {"kafka", "fluvial", "fluvial-flush-none"}
        assert data["machine"]["logical_cores"] >= 1 and data["machine"]["java"].startswith(("openjdk", "java"))
        for case in data["cases"]:
            by_metric = {m["metric"]: m for m in case["metrics"]}
            assert by_metric["broker peak RSS"]["systems"]["kafka"]["summary"]["median"] > 50, case
            # Apache Kafka is the baseline: every one of its cases must have produced figures.
            for metric in case["metrics"]:
                if metric["metric"] in FLUVIAL_ONLY:
                    assert metric["systems"]["kafka"]["summary"] is None, metric
                    continue
                assert metric["systems"]["kafka"]["summary"] is not None, (workload, case["case"], metric)
        # Fluvial answers with figures for librdkafka cases (the Java consumer needs consumer groups).
        confluent_cases = [c for c in data["cases"] if c["case"].startswith("confluent-kafka")]
        first_metric = confluent_cases[0]["metrics"][0]
        measured = [name for name in ("fluvial", "fluvial-flush-none")
                    if first_metric["systems"][name]["summary"] is not None]
        assert measured, f"{workload}: no Fluvial figures; failures: {data['failures']}"
        assert first_metric["ratio_to_kafka"][measured[0]]["median"] > 0

    summary = (tmp_path / "summary.md").read_text()
    for workload in WORKLOADS:
        assert f"## {workload}" in summary
    assert "Apache Kafka 4." in summary and "Fluvial (default" in summary
    png = (tmp_path / "summary.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
