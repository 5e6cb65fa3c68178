"""Apache Kafka's Java console tools run with a client properties file (JAAS, PEM trust store)."""
from __future__ import annotations

import subprocess
from pathlib import Path


def run(cmd: list[str], timeout: float = 120, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, timeout=timeout, input=input)


def console_produce(kafka_dist, bootstrap: str, topic: str, config: Path, lines: list[str],
                    timeout: float = 120) -> subprocess.CompletedProcess:
    """kafka-console-producer.sh --producer.config FILE, keys before ':' on each line."""
    cmd = kafka_dist.java_tool("org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", bootstrap,
                               "--topic", topic, "--producer.config", str(config),
                               "--property", "parse.key=true", "--property", "key.separator=:",
                               "--producer-property", "acks=all",
                               # A refused login fails the send within seconds, not after 2 minutes.
                               "--producer-property", "delivery.timeout.ms=20000",
                               "--producer-property", "request.timeout.ms=10000",
                               "--producer-property", "max.block.ms=15000")
    return run(cmd, timeout, input="".join(f"{line}\n" for line in lines).encode())


def console_consume(kafka_dist, bootstrap: str, topic: str, config: Path, count: int,
                    timeout_ms: int = 30000) -> subprocess.CompletedProcess:
    """kafka-console-consumer.sh --consumer.config FILE from the beginning, printing keys."""
    cmd = kafka_dist.java_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap,
                               "--topic", topic, "--consumer.config", str(config), "--from-beginning",
                               "--max-messages", str(count), "--timeout-ms", str(timeout_ms),
                               "--property", "print.key=true", "--property", "key.separator=:")
    return run(cmd, timeout_ms / 1000 + 90)


def kafka_acls(kafka_dist, bootstrap: str, config: Path, *args: str) -> subprocess.CompletedProcess:
    """kafka-acls.sh --bootstrap-server ... --command-config FILE ARGS."""
    cmd = kafka_dist.java_tool("org.apache.kafka.tools.AclCommand", "--bootstrap-server", bootstrap,
                               "--command-config", str(config), *args)
    return run(cmd, 120)


def printed_records(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.decode().splitlines() if ":" in line]
