"""Spark and Fluvial: the native `format("fluvial")` data source, and the jars of Spark's Kafka source.

>>> import fluvial.spark
>>> spark = SparkSession.builder.config("spark.jars", ",".join(fluvial.spark.kafka_jars())).getOrCreate()
>>> fluvial.spark.register(spark)
>>> spark.read.format("fluvial").option("url", "grpc://127.0.0.1:8815").option("table", "orders").load()
"""
from __future__ import annotations

from typing import Any

from fluvial.spark.kafka_jars import KafkaJarsError, kafka_jars

# Spark 4.1's switch for handing filters to a Python data source's pushFilters.
FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any, filter_pushdown: bool | None = None) -> None:
    """Register `format("fluvial")` with a SparkSession.

    filter_pushdown: hand filters Fluvial can evaluate to the broker (Spark 4.1+; the switch
    is session-wide). Default: on from Spark 4.3. Spark 4.1 and 4.2 keep the read plan of a
    scan with pushed filters on the DataFrame, and a later query on the *same* DataFrame
    without filters reuses it (too few rows); with `True` there, build the DataFrame
    (`spark.read...load()`) per query."""
    from fluvial.spark.source import FluvialDataSource

    spark.dataSource.register(FluvialDataSource)
    if filter_pushdown is None:
        filter_pushdown = _spark_at_least(spark.version, (4, 3))
    if _spark_at_least(spark.version, (4, 1)):
        spark.conf.set(FILTER_PUSHDOWN_CONF, "true" if filter_pushdown else "false")


def _spark_at_least(version: str, wanted: tuple[int, int]) -> bool:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= wanted


__all__ = ["FILTER_PUSHDOWN_CONF", "KafkaJarsError", "kafka_jars", "register"]
