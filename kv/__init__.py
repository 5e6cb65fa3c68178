"""Primary-key tablets on RocksDB: row mergers, changelog, lookups, snapshots."""
from fluvial.kv.bucketing import bucket_of, buckets_of, murmur2, murmur2_array
from fluvial.kv.row_codec import KeyLayout, RowCodec
from fluvial.kv.rowmerger import Action, MergeEngine, MergeSpec
from fluvial.kv.snapshots import SnapshotInfo, SnapshotStore
from fluvial.kv.tablet import ChangeType, KvTablet, KvTabletError, KvWrite

__all__ = ["Action", "ChangeType", "KeyLayout", "KvTablet", "KvTabletError", "KvWrite", "MergeEngine", "MergeSpec",
           "RowCodec", "SnapshotInfo", "SnapshotStore", "bucket_of", "buckets_of", "murmur2", "murmur2_array"]
