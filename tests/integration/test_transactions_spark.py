"""Spark's native source reads Kafka-transactional tables read_committed."""
from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from tests.integration.test_spark import native  # noqa: E402
from tests.integration.test_transactions import _producer, topic  # noqa: E402,F401


def test_spark_reads_committed_rows_only(spark, broker, topic):  # noqa: F811
    from fluvial import client as fc

    p = _producer(broker.bootstrap, f"spark-{topic}")
    p.init_transactions(15)
    for label, commit in (("c", True), ("a", False)):
        p.begin_transaction()
        for i in range(3):
            p.produce(topic, value=f"{label}{i}".encode())
        p.flush(10)
        (p.commit_transaction if commit else p.abort_transaction)(15)
    p.begin_transaction()
    p.produce(topic, value=b"open")
    p.flush(10)
    with fc.connect(broker.flight_url) as c:
        (offsets,) = c.table(topic).offsets()
    # The end offered to planners is the last stable offset: the open transaction's first record.
    assert offsets.high_watermark == 8  # 3 committed, marker, 3 aborted, marker; then the open one
    rows = native(spark, broker, topic).select("value").collect()
    assert sorted(r.value for r in rows) == [b"c0", b"c1", b"c2"]
    p.commit_transaction(15)
    rows = native(spark, broker, topic).select("value").collect()
    assert sorted(r.value for r in rows) == [b"c0", b"c1", b"c2", b"open"]
