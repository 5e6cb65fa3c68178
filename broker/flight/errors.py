"""Fluvial errors -> Flight errors: the one place the table API gives errors their wire form."""
from __future__ import annotations

import functools
import inspect
import json
import logging
from typing import Callable, Iterator

import pyarrow.flight as flight

from fluvial.client.errors import error_info
from fluvial.errors import FluvialError

log = logging.getLogger(__name__)


def to_flight_error(exc: BaseException) -> flight.FlightError:
    """A FluvialError keeps its kind and message (the client raises the same class again);
    anything else is an internal error, logged here with its traceback."""
    if isinstance(exc, flight.FlightError):
        return exc
    if isinstance(exc, FluvialError):
        return flight.FlightServerError(exc.message, extra_info=error_info(exc))
    log.error("table API request failed", exc_info=exc)
    message = f"internal error: {type(exc).__name__}: {exc}"
    return flight.FlightServerError(message, extra_info=json.dumps(
        {"error": "FluvialError", "message": message}).encode())


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
