"""Sans-I/O Kafka wire codec: frames, headers, messages, record batch v2, CRC32C, compression."""
