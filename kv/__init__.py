"""Primary-key tablets on RocksDB."""
