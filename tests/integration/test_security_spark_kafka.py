"""Spark's own Kafka source reads from Fluvial over SASL_SSL (SCRAM-SHA-512): the options
`kafka.security.protocol`, `kafka.sasl.mechanism`, `kafka.sasl.jaas.config` and a PEM trust store."""
from __future__ import annotations

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'pyspark>=4.0')")

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from benchmarks.secure_kafka import Credentials  # noqa: E402
from tests.support.broker_process import BrokerProcess  # noqa: E402
from tests.support.certs import make_pki  # noqa: E402
from tests.support.secure_broker import add_users, kafka_listener_args  # noqa: E402

USERS = {"writer": "writer-pw-1", "spark": "spark-pw-2"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory, pki):
    data = tmp_path_factory.mktemp("spark-sasl") / "data"
    add_users(data, USERS)
    b = BrokerProcess(data, *kafka_listener_args(pki)).start()
    yield b
    b.stop()


def kafka_options(broker, pki, user: str, password: str) -> dict[str, str]:
    creds = Credentials("SCRAM-SHA-512", user, password, pki.ca)
    return {"kafka.bootstrap.servers": broker.bootstrap,
            **{f"kafka.{k}": v for k, v in creds.java().items()}}


def test_spark_kafka_source_reads_over_sasl_ssl(spark, secure_broker, pki, topic_name):
    creds = Credentials("SCRAM-SHA-512", "writer", USERS["writer"], pki.ca).confluent()
    admin = AdminClient({"bootstrap.servers": secure_broker.bootstrap, **creds})
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(15)
    p = Producer({"bootstrap.servers": secure_broker.bootstrap, **creds})
    for i in range(3000):
        p.produce(topic_name, key=f"k{i % 30}".encode(), value=f"value {i}".encode(), partition=i % 2)
    assert p.flush(30) == 0

    options = kafka_options(secure_broker, pki, "spark", USERS["spark"])
    assert options["kafka.security.protocol"] == "SASL_SSL" and options["kafka.ssl.truststore.type"] == "PEM"
    df = (spark.read.format("kafka").options(**options).option("subscribe", topic_name)
          .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())
    rows = df.selectExpr("partition", "offset", "CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v").collect()
    assert sorted(r.v for r in rows) == sorted(f"value {i}" for i in range(3000))
    assert {r.partition for r in rows} == {0, 1}
    assert sorted(r.offset for r in rows if r.partition == 0) == list(range(1500))
