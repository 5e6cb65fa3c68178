"""Apache Kafka 4.2's Java clients (kafka-clients and its runtime dependencies), fetched from
Maven Central into `.cache/kafka-clients-4.2.0/` on first use, for the share-group tests:
KafkaShareConsumer speaks the stable share-group protocol from 4.1 on, and 4.2 adds renewals.
"""
from __future__ import annotations

import fcntl
import shutil
import subprocess
import tempfile
from pathlib import Path

VERSION = "4.2.0"
CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / f"kafka-clients-{VERSION}"
LIBS_DIR = CACHE_DIR / "libs"
_DONE = CACHE_DIR / "libs.complete"

_POM = f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>fluvial.tests</groupId><artifactId>kafka-clients-jars</artifactId><version>{VERSION}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-clients</artifactId><version>{VERSION}</version></dependency>
  </dependencies>
</project>
"""


def fetch() -> Path:
    """The folder of jars (downloaded once; concurrent callers wait for the first)."""
    if _DONE.exists():
        return LIBS_DIR
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _DONE.exists():
            return LIBS_DIR
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError("Maven (mvn) is not on PATH; it fetches kafka-clients")
        (CACHE_DIR / "pom.xml").write_text(_POM)
        staging = Path(tempfile.mkdtemp(prefix="libs-", dir=CACHE_DIR))
        done = subprocess.run([mvn, "-q", "-B", "-f", str(CACHE_DIR / "pom.xml"), "dependency:copy-dependencies",
                               f"-DoutputDirectory={staging}", "-DincludeScope=runtime"],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise RuntimeError(f"mvn failed ({done.returncode}): {done.stdout[-2000:]}")
        if LIBS_DIR.exists():
            shutil.rmtree(LIBS_DIR)
        staging.rename(LIBS_DIR)
        _DONE.write_text("\n".join(sorted(p.name for p in LIBS_DIR.glob("*.jar"))) + "\n")
    return LIBS_DIR


def classpath() -> str:
    return ":".join(str(p) for p in sorted(fetch().glob("*.jar")))
