"""Re-runnable measurements of Fluvial side by side with Apache Kafka on the same machine."""
