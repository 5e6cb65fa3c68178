"""What the figures were measured on: cores, memory, OS, Python, Java, client and broker versions;
and the CPU a process has used, for figures per record."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import psutil

from benchmarks import kafka_dist


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=kafka_dist.REPO_ROOT,
                              capture_output=True, text=True, timeout=10)
        return done.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def describe() -> dict[str, object]:
    import confluent_kafka
    from importlib.metadata import version

    try:
        java = kafka_dist.java_version()
    except kafka_dist.KafkaDistError:
        java = "not found"
    return {
        "cpu": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "java": java,
        "confluent_kafka": version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "apache_kafka": kafka_dist.KAFKA_VERSION,
        "git_commit": _git_commit(),
    }


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` has used so far (all its threads)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system
