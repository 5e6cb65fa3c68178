"""The jars of Spark's Kafka source for the installed PySpark, fetched once from Maven Central with Maven.

>>> from fluvial.spark import kafka_jars
>>> spark = SparkSession.builder.config("spark.jars", ",".join(kafka_jars())).getOrCreate()

`python -m fluvial.spark.kafka_jars fetch` fills the cache ahead of time (CI does).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SCALA_BINARY_VERSION = "2.13"
REPO_ROOT = Path(__file__).resolve().parent.parent
# Only these are taken from the resolved tree: everything else the Kafka source needs
# (lz4, snappy, zstd-jni, slf4j, Avro, Hadoop's client) already ships in PySpark's jars/, and
# a second copy of those on the class path invites version clashes. spark-avro brings
# from_avro/to_avro, which Avro values read through the Kafka source need.
WANTED = ("spark-sql-kafka-0-10", "spark-token-provider-kafka-0-10", "kafka-clients", "commons-pool2", "spark-avro")
# Some Maven Central mirrors lack the newer releases of two small companions of the Kafka
# source (while spark-sql-kafka-0-10 itself is there). When the Spark version's own cannot be
# resolved these are used in their place; both were checked against Spark 4.2.0.
# spark-token-provider-kafka-0-10 only carries delegation-token support (API unchanged in 4.x).
FALLBACKS = {"spark-token-provider-kafka-0-10": "4.0.0", "spark-avro": "4.1.1"}


class KafkaJarsError(RuntimeError):
    """The Kafka source's jars are not in the cache and cannot be fetched."""


def spark_version() -> str:
    """The installed PySpark's version (the Kafka source must be built for exactly this one)."""
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        raise KafkaJarsError("PySpark is not installed (pip install 'pyspark>=4.0')") from None


def cache_dir(version: str | None = None) -> Path:
    """`<repo>/.cache/spark-kafka-<version>/`, or under $FLUVIAL_CACHE_DIR when set."""
    root = Path(os.environ["FLUVIAL_CACHE_DIR"]) if os.environ.get("FLUVIAL_CACHE_DIR") else REPO_ROOT / ".cache"
    return root / f"spark-kafka-{version or spark_version()}"


def _pom(version: str, pins: dict[str, str]) -> str:
    """A pom whose dependencies are the Kafka source and spark-avro of `version`, with the
    companions in `pins` at the versions given there instead."""
    spark = "<groupId>org.apache.spark</groupId>"

    def dep(artifact: str, v: str, exclude: list[str] = ()) -> str:
        ex = "".join(f"<exclusion>{spark}<artifactId>{e}_{SCALA_BINARY_VERSION}</artifactId></exclusion>"
                     for e in exclude)
        return (f"<dependency>{spark}<artifactId>{artifact}_{SCALA_BINARY_VERSION}</artifactId><version>{v}</version>"
                + (f"<exclusions>{ex}</exclusions>" if ex else "") + "</dependency>")

    deps = [dep("spark-sql-kafka-0-10", version, [a for a in pins if a != "spark-avro"]),
            dep("spark-avro", pins.get("spark-avro", version))]
    deps += [dep(a, v) for a, v in pins.items() if a != "spark-avro"]
    body = "\n    ".join(deps)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>fluvial.spark</groupId>
  <artifactId>spark-kafka-jars</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    {body}
  </dependencies>
</project>
"""


# Spark's poms name a Google mirror of Maven Central as a repository; where only Maven
# Central itself is reachable that lookup fails, so it is sent to Maven Central. Given as
# the global settings: a user's own ~/.m2/settings.xml (proxies, mirrors) still applies.
_SETTINGS = """<?xml version="1.0" encoding="UTF-8"?>
<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors>
    <mirror><id>fluvial-central</id><mirrorOf>gcs-maven-central-mirror</mirrorOf>
      <url>https://repo.maven.apache.org/maven2/</url></mirror>
  </mirrors>
</settings>
"""


def _jars_in(folder: Path) -> list[Path]:
    jars = sorted(folder.glob("*.jar"))
    found = [next((j for j in jars if j.name.startswith(w)), None) for w in WANTED]
    return [j for j in found if j is not None] if all(found) else []


def cached(version: str | None = None) -> list[Path]:
    """The cached jars, or [] when the cache is missing or incomplete."""
    libs = cache_dir(version) / "libs"
    if not (cache_dir(version) / "libs.complete").exists() or not libs.is_dir():
        return []
    return _jars_in(libs)


def fetch(version: str | None = None, quiet: bool = True) -> list[Path]:
    """Resolve and copy the jars into the cache (once). Raises KafkaJarsError with the reason."""
    version = version or spark_version()
    have = cached(version)
    if have:
        return have
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaJarsError(
            f"Spark's Kafka source jars for Spark {version} are not cached in {cache_dir(version)} and Maven (mvn) is "
            f"not on PATH to fetch them; install Maven, or pass the jars yourself with "
            f"--packages org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}:{version}")
    folder = cache_dir(version)
    folder.mkdir(parents=True, exist_ok=True)
    settings = folder / "settings.xml"
    settings.write_text(_SETTINGS)
    pins: dict[str, str] = {}
    while True:
        staging, failure = _resolve(mvn, folder, settings, version, pins, quiet)
        if staging is not None:
            break
        missing = [a for a in FALLBACKS if a in failure and a not in pins and version.startswith("4.")]
        if not missing:
            break
        pins[missing[0]] = FALLBACKS[missing[0]]
    if staging is None:
        raise KafkaJarsError(
            f"could not fetch Spark's Kafka source jars for Spark {version} from Maven Central; "
            f"is Maven Central reachable?\n{failure}".rstrip())
    libs = folder / "libs"
    if libs.exists():
        shutil.rmtree(libs)
    staging.rename(libs)
    (folder / "libs.complete").write_text("\n".join(p.name for p in _jars_in(libs)) + "\n")
    return _jars_in(libs)


def _resolve(mvn: str, folder: Path, settings: Path, version: str, pins: dict[str, str],
             quiet: bool) -> tuple[Path | None, str]:
    """Copy the jars into a fresh folder (renamed into place by the caller, so that an
    interrupted fetch never looks complete). Returns it, or None and Maven's complaint."""
    pom = folder / "pom.xml"
    pom.write_text(_pom(version, pins))
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=folder))
    includes = ",".join(f"{w}_{SCALA_BINARY_VERSION}" if w.startswith("spark-") else w for w in WANTED)
    # -U: a version missing from an earlier attempt is looked up again, not taken from
    # Maven's cache of failures.
    cmd = [mvn, "-B", "-U", "-gs", str(settings), "-f", str(pom), "dependency:copy-dependencies",
           f"-DoutputDirectory={staging}", "-DincludeScope=runtime", f"-DincludeArtifactIds={includes}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if not quiet:
        sys.stderr.write(done.stdout[-4000:])
    if done.returncode == 0 and _jars_in(staging):
        return staging, ""
    shutil.rmtree(staging, ignore_errors=True)
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("[ERROR]")]
    return None, "\n".join(errors[:3]) or f"mvn exit {done.returncode}"


def kafka_jars(version: str | None = None) -> list[str]:
    """Local paths of spark-sql-kafka-0-10, spark-token-provider-kafka-0-10 (of the installed
    Spark version), kafka-clients, commons-pool2 and spark-avro (for from_avro), ready for
    `spark.jars`; fetched into the cache on first use."""
    return [str(p) for p in fetch(version)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fluvial.spark.kafka_jars",
                                     description="Spark's Kafka source jars for the installed PySpark")
    parser.add_argument("command", choices=["fetch", "path"], help="fetch: fill the cache; path: print the jars")
    parser.add_argument("--spark-version", help="default: the installed PySpark's version")
    args = parser.parse_args(argv)
    try:
        jars = fetch(args.spark_version, quiet=args.command == "path")
    except KafkaJarsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(",".join(str(j) for j in jars) if args.command == "path" else "\n".join(str(j) for j in jars))
    return 0


if __name__ == "__main__":
    sys.exit(main())
