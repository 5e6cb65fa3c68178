"""Fluvial: a Kafka-protocol-compatible table broker storing every topic as Arrow IPC."""
__version__ = "0.1.0"
