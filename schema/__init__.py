"""Schema registry and Avro/JSON <-> Arrow mapping."""
