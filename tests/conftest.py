"""Shared fixtures: a real broker process per test session, and fresh ones on demand."""
from __future__ import annotations

import os
import sys
import uuid

import pytest

from tests.support.broker_process import BrokerProcess
from tests.support.moto_server import MotoServer, moto_server_command


def pytest_configure(config) -> None:
    # Spark's Python workers import `fluvial` from the interpreter they run: the one running the
    # tests (a virtual environment's), not whichever `python3` comes first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Every SparkSession of one pytest process runs in one JVM, launched by the first session
    # any test creates; jars given later as `spark.jars` never reach that JVM's classpath. So the
    # Kafka source's jars (fetched by .ci/run) go on the launch command, whichever test is first.
    try:
        from fluvial.spark.kafka_jars import cached
    except ImportError:   # pyspark not installed: no Spark tests run
        return
    jars = cached()
    if jars and "PYSPARK_SUBMIT_ARGS" not in os.environ:
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {','.join(str(j) for j in jars)} pyspark-shell"


def pytest_report_header(config) -> str:
    # Which code the tests run and whether the C record codec is in it: a checkout beside a
    # non-editable install, or a machine without a compiler, shows here at once.
    import fluvial.broker
    from fluvial.protocol import records

    codec = "compiled" if records.HAS_NATIVE else f"pure Python ({records.NATIVE_IMPORT_ERROR})"
    return f"fluvial: {os.path.dirname(os.path.dirname(fluvial.broker.__file__))}, record codec: {codec}"


@pytest.fixture(scope="session")
def broker(tmp_path_factory) -> BrokerProcess:
    """One broker for the whole session (auto topic creation on, 1 partition by default)."""
    b = BrokerProcess(tmp_path_factory.mktemp("broker") / "data").start()
    yield b
    b.stop()


@pytest.fixture
def fresh_broker(tmp_path):
    """A broker of this test's own, started on demand with extra command-line arguments."""
    started: list[BrokerProcess] = []

    def make(*args: str) -> BrokerProcess:
        b = BrokerProcess(tmp_path / f"data{len(started)}", *args).start()
        started.append(b)
        return b

    yield make
    for b in started:
        if b.alive():
            b.stop()


@pytest.fixture(scope="session")
def java_tools():
    """Apache Kafka's Java clients and tools (`benchmarks.kafka_dist`), fetched from Maven
    Central on first use; the tests that need them are skipped, saying why, without it."""
    from benchmarks import kafka_dist

    if not kafka_dist.is_fetched():
        try:
            kafka_dist.fetch()
        except Exception as exc:  # noqa: BLE001 - no Maven Central: say why the tests cannot run
            pytest.skip(f"Apache Kafka's jars are not available: {exc}")
    return kafka_dist


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local Spark session for every Spark test of the run (starting a SparkContext costs
    seconds; the JVM is shared anyway): UTC, Fluvial's data source registered, the Kafka
    source's jars on the launch command (above)."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'pyspark>=4.0')")
    from fluvial.tiering.lake.spark_job import spark_session

    session = spark_session("local[2]", {
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.stopTimeout": "30s", "spark.driver.memory": "2g",
        "spark.local.dir": str(tmp_path_factory.mktemp("spark-local"))})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory):
    """A real S3-compatible server process (moto_server) on loopback, for the whole session;
    the S3 tests are skipped, saying why, when moto_server is not installed."""
    if moto_server_command() is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto_server.log").start()
    yield server
    server.stop()


@pytest.fixture(params=["local", "s3"])
def object_store(request, tmp_path):
    """An object store of each kind: a local folder, and a bucket (under a nested prefix) on the
    session's moto_server process."""
    from fluvial.tiering.object_store import open_object_store

    if request.param == "local":
        yield open_object_store((tmp_path / "remote").as_uri())
        return
    server = request.getfixturevalue("moto_s3")
    store = open_object_store(f"s3://{server.create_bucket()}/some/prefix", server.options())
    yield store
    store.close()


@pytest.fixture
def own_moto_s3(tmp_path):
    """A moto_server process of this test's own (for tests that kill and restart the store)."""
    if moto_server_command() is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    server = MotoServer(tmp_path / "moto_server.log").start()
    yield server
    server.stop()
