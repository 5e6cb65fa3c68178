"""Typed errors of the table API: Fluvial's error classes, plus the two only tables have."""
from __future__ import annotations

import json

import pyarrow.flight as flight

from fluvial.protocol.errors import ErrorCode
from fluvial.errors import (
    FluvialError, InvalidConfigError, LakeLeaseError, InvalidPartitionsError, InvalidRecordError, InvalidRequestError,
    InvalidTableError, OffsetOutOfRangeError, SchemaMismatchError, StorageError, TableExistsError,
    UnknownColumnError, UnknownTableError,
)


class BrokerUnavailableError(FluvialError):
    """The broker cannot be reached (not started, wrong address, or gone)."""


class AuthenticationError(FluvialError):
    """The broker did not accept the client's credentials (missing, wrong, or an expired token)."""
    code = ErrorCode.SASL_AUTHENTICATION_FAILED
    http_status = 401


class AuthorizationError(FluvialError):
    """The broker's ACLs do not allow the user this operation on this table."""
    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    http_status = 403


# A scan's filter is checked by the client before any request: these are raised there.
class FilterError(InvalidRequestError, ValueError):
    """A filter with an unknown operator, or a value that does not fit its column."""


class FilterColumnError(UnknownColumnError, ValueError):
    """A filter that names a column the table does not have."""


class FilterTypeError(InvalidRequestError, TypeError):
    """Something that is not a filter (a string, a number), or an expression whose types
    do not fit the columns (a text column compared with a number)."""


ERRORS: dict[str, type[FluvialError]] = {cls.__name__: cls for cls in (
    FluvialError, InvalidConfigError, InvalidPartitionsError, InvalidRecordError, InvalidRequestError,
    InvalidTableError, OffsetOutOfRangeError, StorageError, TableExistsError, UnknownTableError,
    UnknownColumnError, SchemaMismatchError, LakeLeaseError,
)}


def error_info(exc: FluvialError) -> bytes:
    """The `extra_info` of the Flight error the server sends for `exc`."""
    kind = next(cls.__name__ for cls in type(exc).__mro__ if cls.__name__ in ERRORS)
    return json.dumps({"error": kind, "message": exc.message}).encode()


def from_flight(exc: flight.FlightError) -> FluvialError:
    """The typed error a Flight error stands for (its message without gRPC's decorations)."""
    info = getattr(exc, "extra_info", None) or b""
    try:
        body = json.loads(info)
        return ERRORS.get(body.get("error"), FluvialError)(body.get("message", ""))
    except (ValueError, AttributeError):
        pass
    # A broker that stops (or restarts) cancels the calls it is serving: to the caller that is
    # the broker going away, not a refusal, so readers resume as they do after UNAVAILABLE.
    if isinstance(exc, flight.FlightUnauthenticatedError):
        return AuthenticationError(_flight_message(exc))
    if isinstance(exc, flight.FlightUnauthorizedError):
        return AuthorizationError(_flight_message(exc))
    if isinstance(exc, (flight.FlightUnavailableError, flight.FlightCancelledError)):
        return BrokerUnavailableError(str(exc))
    return FluvialError(str(exc))


def _flight_message(exc: flight.FlightError) -> str:
    """The server's message without gRPC's '. Detail: ...' decoration."""
    return str(exc).split(". Detail:")[0]


__all__ = [
    "AuthenticationError", "AuthorizationError", "BrokerUnavailableError", "FilterColumnError", "FilterError", "FilterTypeError", "FluvialError", "InvalidConfigError", "InvalidPartitionsError", "InvalidRecordError",
    "InvalidRequestError", "InvalidTableError", "LakeLeaseError", "OffsetOutOfRangeError", "SchemaMismatchError", "StorageError",
    "TableExistsError", "UnknownColumnError", "UnknownTableError", "error_info", "from_flight",
]
