"""Spark and Fluvial: the native `format("fluvial")` data source, and the jars of Spark's Kafka source.

>>> import fluvial.spark
>>> spark = SparkSession.builder.config("spark.jars", ",".join(fluvial.spark.kafka_jars())).getOrCreate()
>>> fluvial.spark.register(spark)
>>> spark.read.format("fluvial").option("url", "grpc://127.0.0.1:8815").option("table", "orders").load()
>>> fluvial.spark.read_table(spark, "orders", url="grpc://127.0.0.1:8815", columns=["id", "amount"])
"""
from __future__ import annotations

from typing import Any

from fluvial.spark.kafka_jars import KafkaJarsError, kafka_jars

# Spark 4.1's switch for handing filters to a Python data source's pushFilters.
FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def read_table(spark: Any, name: str, **kwargs: Any) -> Any:
    """A table as one DataFrame; lake-enabled log tables read their lake snapshot with Spark's
    Parquet reader (see `fluvial.spark.tables.read_table` for the arguments)."""
    from fluvial.spark.tables import read_table as _read_table

    return _read_table(spark, name, **kwargs)


def register(spark: Any) -> None:
    """Register `format("fluvial")` with a SparkSession. On Spark 4.1+ this also switches on
    `spark.sql.python.filterPushdown.enabled` (session-wide, for every Python data source),
    so that reads with the option `pushFilters` hand filters to the broker."""
    from fluvial.spark.source import FluvialDataSource

    spark.dataSource.register(FluvialDataSource)
    if _spark_at_least(spark.version, (4, 1)):
        spark.conf.set(FILTER_PUSHDOWN_CONF, "true")


def _spark_at_least(version: str, wanted: tuple[int, int]) -> bool:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= wanted


__all__ = ["FILTER_PUSHDOWN_CONF", "KafkaJarsError", "kafka_jars", "read_table", "register"]
