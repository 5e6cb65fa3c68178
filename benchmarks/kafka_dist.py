"""Apache Kafka's broker, client and tools jars, fetched once from Maven Central with Maven."""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The one place the Apache Kafka version is pinned (broker, clients and tools alike).
KAFKA_VERSION = "4.1.2"
SCALA_BINARY_VERSION = "2.13"
# Kafka 4.1 logs through SLF4J 1.7; this binding sends it to Log4j 2, which Kafka already uses.
LOG4J_VERSION = "2.25.3"

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".cache" / f"kafka-{KAFKA_VERSION}"
LIBS_DIR = CACHE_DIR / "libs"
_COMPLETE_MARK = CACHE_DIR / "libs.complete"
_LOG4J_CONFIG = CACHE_DIR / "log4j2.properties"

_ARTIFACTS = (
    ("org.apache.kafka", f"kafka_{SCALA_BINARY_VERSION}", KAFKA_VERSION),
    ("org.apache.kafka", "kafka-tools", KAFKA_VERSION),
    ("org.apache.kafka", "kafka-clients", KAFKA_VERSION),
    ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
)

# Logs go to stderr (stdout of the tools carries their figures); the level is a system property
# so that the broker can log at INFO into its own file while tools stay quiet.
_LOG4J_PROPERTIES = """\
status = error
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = ${sys:fluvial.bench.logLevel:-WARN}
rootLogger.appenderRef.err.ref = STDERR
"""


class KafkaDistError(RuntimeError):
    """Apache Kafka's jars could not be fetched or a JVM could not be found."""


def _pom() -> str:
    deps = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in _ARTIFACTS
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>fluvial.benchmarks</groupId>
  <artifactId>apache-kafka-jars</artifactId>
  <version>{KAFKA_VERSION}</version>
  <packaging>pom</packaging>
  <dependencies>
{deps}
  </dependencies>
</project>
"""


def is_fetched() -> bool:
    return _COMPLETE_MARK.exists() and LIBS_DIR.is_dir()


def fetch(quiet: bool = True) -> Path:
    """Download the jars into the cache once; later calls return at once. Returns the libs folder."""
    if is_fetched():
        _write_log4j_config()
        return LIBS_DIR
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # Test processes may ask at the same moment: one downloads, the others wait for it.
    with open(CACHE_DIR / "fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_fetched():
            _download(quiet)
    _write_log4j_config()
    return LIBS_DIR


def _download(quiet: bool) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaDistError("Maven (mvn) is not on PATH; it fetches Apache Kafka's jars")
    pom = CACHE_DIR / "pom.xml"
    pom.write_text(_pom())
    # Copy into a fresh folder and rename it into place, so an interrupted fetch never leaves a
    # half-filled libs folder that looks complete.
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=CACHE_DIR))
    cmd = [
        mvn, "-B", "-f", str(pom), "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
    ]
    if quiet:
        cmd.insert(2, "-q")
    done = subprocess.run(cmd, capture_output=quiet, text=True)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        detail = (done.stdout or "")[-4000:] if quiet else ""
        raise KafkaDistError(f"mvn dependency:copy-dependencies failed ({done.returncode})\n{detail}")
    if LIBS_DIR.exists():
        shutil.rmtree(LIBS_DIR)
    staging.rename(LIBS_DIR)
    _COMPLETE_MARK.write_text("\n".join(sorted(p.name for p in LIBS_DIR.glob("*.jar"))) + "\n")


def _write_log4j_config() -> None:
    if not _LOG4J_CONFIG.exists() or _LOG4J_CONFIG.read_text() != _LOG4J_PROPERTIES:
        staged = _LOG4J_CONFIG.with_suffix(f".{os.getpid()}")
        staged.write_text(_LOG4J_PROPERTIES)
        staged.replace(_LOG4J_CONFIG)  # atomic: a JVM starting now never reads half a file


def kafka_classpath() -> str:
    """Class path with Apache Kafka's server, clients and tools jars (fetching them if needed)."""
    libs = fetch()
    return os.pathsep.join(str(p) for p in sorted(libs.glob("*.jar")))


def java_executable() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KafkaDistError("no java on PATH and JAVA_HOME unset; Apache Kafka needs Java 17+")
    return java


def java_tool(main_class: str, *args: str, jvm_opts: tuple[str, ...] = (), log_level: str = "WARN") -> list[str]:
    """A command line running one of Kafka's Java entry points, e.g.
    `java_tool("org.apache.kafka.tools.ProducerPerformance", "--topic", "t", ...)`."""
    return [
        java_executable(),
        *jvm_opts,
        f"-Dlog4j2.configurationFile={_LOG4J_CONFIG}",
        f"-Dfluvial.bench.logLevel={log_level}",
        "-cp", kafka_classpath(),
        main_class,
        *args,
    ]


def java_version() -> str:
    done = subprocess.run([java_executable(), "-version"], capture_output=True, text=True)
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[0] if lines else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kafka_dist",
                                     description=f"Apache Kafka {KAFKA_VERSION} jars from Maven Central")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download the jars into the cache (once)")
    sub.add_parser("classpath", help="print the class path (fetching first if needed)")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(fetch(quiet=False))
        else:
            print(kafka_classpath())
    except KafkaDistError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
