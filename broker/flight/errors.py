"""Fluvial errors -> Flight errors: the one place the table API gives errors their wire form."""
from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from fluvial.client.errors import error_info
from fluvial.errors import FluvialError, InvalidRequestError

log = logging.getLogger(__name__)


def to_flight_error(exc: BaseException) -> flight.FlightError:
    """A FluvialError keeps its kind and message (the client raises the same class again);
    anything else is an internal error, logged here with its traceback."""
    if isinstance(exc, flight.FlightError):
        return exc
    if isinstance(exc, FluvialError):
        # The client's mistake (or a state it can act on): no traceback in the log.
        log.info("table API request refused: %s: %s", type(exc).__name__, exc.message)
        return flight.FlightServerError(exc.message, extra_info=error_info(exc))
    log.error("table API request failed", exc_info=exc)
    message = f"internal error: {type(exc).__name__}: {exc}"
    return flight.FlightServerError(message, extra_info=json.dumps(
        {"error": "FluvialError", "message": message}).encode())


# What decoding a malformed request raises: bad JSON (ValueError), wrong JSON types
# (TypeError, AttributeError, KeyError for a missing member), bad base64 (binascii.Error)
# and invalid Arrow IPC bytes (ArrowInvalid, a ValueError).
_MALFORMED = (ValueError, TypeError, KeyError, IndexError, AttributeError, UnicodeDecodeError, pa.ArrowException)


@contextlib.contextmanager
def malformed_request(what: str) -> Iterator[None]:
    """Errors raised while reading a request's ticket, command or body become
    InvalidRequestError (INVALID_ARGUMENT to the client), saying what was malformed."""
    try:
        yield
    except (FluvialError, flight.FlightError):  # already a client error (e.g. an ACL refusal)
        raise
    except _MALFORMED as exc:
        raise InvalidRequestError(f"malformed {what}: {type(exc).__name__}: {exc}") from None


def json_object(data: bytes | None, what: str) -> dict:
    """A request body or command that must be one JSON object ({} when empty)."""
    with malformed_request(what):
        body = json.loads(data or b"{}")
    if not isinstance(body, dict):
        raise InvalidRequestError(f"malformed {what}: expected a JSON object, got {type(body).__name__}")
    return body


def flight_errors(method: Callable) -> Callable:
    """Decorates a Flight server method so that errors leave it as Flight errors, also those
    raised while a returned generator or GeneratorStream is being consumed."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            result = method(*args, **kwargs)
        except Exception as exc:
            raise to_flight_error(exc) from exc
        if inspect.isgenerator(result):
            return guard(result)
        return result

    return wrapper


def guard(items: Iterator) -> Iterator:
    try:
        yield from items
    except GeneratorExit:
        raise
    except flight.FlightError:
        raise
    except Exception as exc:
        raise to_flight_error(exc) from exc
