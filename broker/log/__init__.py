"""Log tablets: per-bucket logs of Arrow IPC segments with offset and time indexes."""
from fluvial.broker.log.batch_meta import BatchMeta, StoredBatch
from fluvial.broker.log.config import FlushPolicy, LogConfig, TimestampType
from fluvial.broker.log.leader_epoch import LeaderEpochCache
from fluvial.broker.log.tablet import LogTablet, SegmentInfo

__all__ = [
    "BatchMeta",
    "FlushPolicy",
    "LeaderEpochCache",
    "LogConfig",
    "LogTablet",
    "SegmentInfo",
    "StoredBatch",
    "TimestampType",
]
