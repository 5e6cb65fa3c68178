"""The one exception hierarchy of Fluvial, each class carrying its Kafka error code.

Code that detects a problem raises one of these; the Kafka handlers, the HTTP
registry and the Flight server each map them to their wire form in one place.
"""
from __future__ import annotations

from fluvial.protocol.errors import ErrorCode


class FluvialError(Exception):
    """Base of every error Fluvial reports to a client."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR
    http_status: int = 500

    def __init__(self, message: str = "", *, code: ErrorCode | None = None):
        super().__init__(message or self.__class__.__name__)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class CorruptRecordError(FluvialError):
    """A record batch that fails its CRC or cannot be parsed."""
    code = ErrorCode.CORRUPT_MESSAGE
    http_status = 400


class InvalidRecordError(FluvialError):
    """A well-formed record that the table refuses (schema, offsets, ...)."""
    code = ErrorCode.INVALID_RECORD
    http_status = 422

    def __init__(self, message: str = "", *, record_errors: list[tuple[int, str]] | None = None):
        super().__init__(message)
        self.record_errors = record_errors or []


class SchemaMismatchError(InvalidRecordError):
    """Rows whose columns or types do not match the table's schema."""


class UnsupportedCompressionError(FluvialError):
    code = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    http_status = 400


class UnsupportedVersionError(FluvialError):
    code = ErrorCode.UNSUPPORTED_VERSION
    http_status = 400


class UnknownTableError(FluvialError):
    """Unknown topic/table or bucket."""
    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    http_status = 404


class TableExistsError(FluvialError):
    code = ErrorCode.TOPIC_ALREADY_EXISTS
    http_status = 409


class InvalidTableError(FluvialError):
    """A bad topic name or table definition."""
    code = ErrorCode.INVALID_TOPIC_EXCEPTION
    http_status = 400


class InvalidConfigError(FluvialError):
    code = ErrorCode.INVALID_CONFIG
    http_status = 400


class InvalidPartitionsError(FluvialError):
    code = ErrorCode.INVALID_PARTITIONS
    http_status = 400


class OffsetOutOfRangeError(FluvialError):
    code = ErrorCode.OFFSET_OUT_OF_RANGE
    http_status = 416


class MessageTooLargeError(FluvialError):
    code = ErrorCode.MESSAGE_TOO_LARGE
    http_status = 413


class InvalidRequestError(FluvialError):
    code = ErrorCode.INVALID_REQUEST
    http_status = 400


class UnknownColumnError(InvalidRequestError):
    """A scan, filter or key names a column the table does not have."""
    http_status = 400


class StorageError(FluvialError):
    code = ErrorCode.KAFKA_STORAGE_ERROR
    http_status = 500


class ObjectNotFound(StorageError):
    """A key the object store does not hold (a remote segment that was removed, a typo)."""
    http_status = 404


class ObjectStoreError(StorageError):
    """The object store could not be reached or refused a request (down, no permission)."""
    http_status = 503


class CorruptRemoteDataError(StorageError):
    """A remote object that exists but does not hold what its manifest says (size, checksum, format)."""


class ProducerFencedError(FluvialError):
    code = ErrorCode.INVALID_PRODUCER_EPOCH
    http_status = 409


class OutOfOrderSequenceError(FluvialError):
    code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    http_status = 409


class LakeLeaseError(FluvialError):
    """A tiering job's lease on a lake table expired or was handed to another job: its
    heartbeat or report is refused (what it committed to the lake is reconciled by the next)."""
    code = ErrorCode.INVALID_REQUEST
    http_status = 409


class BrokerStartError(Exception):
    """The broker cannot start (stored state it must not guess about is unreadable, settings
    cannot work); the message says what and where. `fluvial broker` prints it and exits 1."""
