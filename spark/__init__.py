"""Spark data source and Kafka-source helpers."""
