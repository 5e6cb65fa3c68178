"""One module per Kafka API (or API family): read the request, build the response.

A handler is an async function registered with `@handles(api_key, min_version,
max_version)`. It receives the `RequestContext` and the decoded request and returns the
response message, `None` for no response (acks=0 produce), or a `Deferred` whose
awaitable yields the response later (the connection keeps reading and handling the next
requests meanwhile, and still answers in request order). The advertised ApiVersions are
exactly the registered handlers' ranges.
"""
from __future__ import annotations

import asyncio
import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from fluvial.protocol.messages import RESPONSE_CLASSES, RequestHeader
from fluvial.security.principal import ANONYMOUS, Principal

if TYPE_CHECKING:
    from fluvial.broker.broker import Broker


@dataclass(slots=True)
class RequestContext:
    broker: "Broker"
    header: RequestHeader
    peer: str
    # Who sent the request (set by the listener once the connection authenticated) and from
    # which host, as ACLs see them.
    principal: Principal = ANONYMOUS

    @property
    def version(self) -> int:
        return self.header.api_version

    def response(self, **fields: Any):
        """A response message of the request's API at the request's version."""
        return RESPONSE_CLASSES[self.header.api_key](version=self.header.api_version, **fields)


@dataclass(slots=True)
class Deferred:
    """A response that is completed later (e.g. after the produce batch is fsynced)."""
    awaitable: Awaitable[Any]


class Reply:
    """A framed answer (bytes, or None: nothing to send) completed later by a plain call,
    for a `Deferred` (a produce waiting for its fsync).

    The connection's `Answers` writes it from within that call (``set_result``), where an
    asyncio future would schedule a loop callback per answer: many small producers mean
    thousands of answers a second on the one event loop. It may be awaited too (then
    through a future made on demand)."""

    __slots__ = ("finished", "result", "failure", "on_done")

    def __init__(self) -> None:
        self.finished = False
        self.result: Any = None
        self.failure: BaseException | None = None  # CancelledError when the loop stopped first
        # Called with the Reply once it is finished (set by its one consumer).
        self.on_done: Callable[["Reply"], None] | None = None

    def set_result(self, result: Any) -> None:
        # `_finish` written out: one call less for each acknowledgement.
        if not self.finished:
            self.finished = True
            self.result = result
            if self.on_done is not None:
                self.on_done(self)

    def set_failure(self, failure: BaseException) -> None:
        self._finish(None, failure)

    def _finish(self, result: Any, failure: BaseException | None) -> None:
        if not self.finished:
            self.finished = True
            self.result, self.failure = result, failure
            if self.on_done is not None:
                self.on_done(self)

    def __await__(self):
        if not self.finished:
            future = asyncio.get_running_loop().create_future()
            self.on_done = lambda _: future.done() or future.set_result(None)
            yield from future
        if self.failure is not None:
            raise self.failure
        return self.result


Handler = Callable[[RequestContext, Any], Awaitable[Any]]


@dataclass(slots=True)
class Registration:
    handler: Handler
    min_version: int
    max_version: int
    # Versions advertised but answered with UNSUPPORTED_VERSION (Produce v0-2, KIP-896).
    rejected_below: int


HANDLERS: dict[int, Registration] = {}


def handles(api_key: int, min_version: int, max_version: int, *, rejected_below: int | None = None):
    def register(fn: Handler) -> Handler:
        HANDLERS[int(api_key)] = Registration(fn, min_version, max_version,
                                              rejected_below if rejected_below is not None else min_version)
        return fn
    return register


def supported_versions() -> dict[int, tuple[int, int]]:
    return {k: (r.min_version, r.max_version) for k, r in sorted(HANDLERS.items())}


def load_all() -> None:
    """Import every handler module so that its registrations run."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
