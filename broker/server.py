"""The Kafka listener: reads framed requests from each connection and answers in order.

Requests of one connection are handled one after another, as Kafka does, so that
pipelined produce requests append in the order they were sent. A handler may return a
`Deferred` (a produce waiting for its fsync); the connection then goes on with the next
request while its `Answers` write the responses strictly in request order, each as soon
as it and every one before it are ready (from the callback that completes it: no writer
task, no queue).

A connection with nothing in progress and no request or response for
`connections.max.idle.ms` is closed (as Kafka does), by one sweeper task for all
connections rather than a timer each.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import logging
import struct
import time
import types
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable

from fluvial.broker import frames
from fluvial.broker.handlers import HANDLERS, Deferred, Reply, RequestContext, supported_versions
from fluvial.broker.handlers.produce import produce_one
from fluvial.broker.request_stats import RequestStats
from fluvial.errors import FluvialError, InvalidRequestError
from fluvial.protocol import produce_request
from fluvial.protocol.fetch_response import EncodedResponse
from fluvial.protocol.messages import (ApiKey, RequestHeader, decode_request_body, decode_request_header,
                                       encode_api_versions_unsupported, encode_response, error_response)
from fluvial.protocol.errors import ErrorCode
from fluvial.security.principal import ANONYMOUS, Principal
from fluvial.security.sasl import secure_connection

if TYPE_CHECKING:
    from fluvial.broker.broker import Broker

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
# Responses a connection may have outstanding before it stops reading more requests.
MAX_IN_FLIGHT = 64
# At most this many ready answers of a connection are joined into one write.
_MAX_COALESCED = 32
# Answers written but not yet sent beyond this: the connection reads no further request
# until the client has taken them (a slow consumer of large fetches).
_WRITE_BACKLOG = 1 << 20


def _api_key(frame: memoryview) -> int:
    """The request's API key (the header's first int16), for the request metrics."""
    return (frame[0] << 8 | frame[1]) if len(frame) >= 2 else -1


class CloseConnection(Exception):
    """The request cannot be answered; Kafka's reply to that is closing the connection.
    `reply`: a last answer sent before closing (e.g. why authentication failed)."""

    def __init__(self, message: str, reply: bytes | None = None):
        super().__init__(message)
        self.reply = reply


@dataclass(eq=False)
class Connection:
    """What the server knows of one client connection: enough to close it when idle."""

    peer: str
    writer: asyncio.StreamWriter
    last_active: float
    # Requests read whose responses are not written yet (a long-polling fetch, a produce
    # waiting for its fsync): such a connection is not idle, however long they take.
    in_progress: int = 0
    # Listeners with authentication: who the client is, and the gate its requests pass
    # through (security/sasl.py); None on a PLAINTEXT connection.
    principal: Principal = ANONYMOUS
    auth: Any = None


class Answers:
    """A connection's answers in request order, written as soon as the oldest is ready.

    Each entry is a framed answer (bytes), a fetch's chunks (a list), None (nothing to
    send) or a future that completes with one of those (a long-polling fetch) or a `Reply`
    (a produce waiting for its fsync). A future's done-callback, or the call that finishes
    a Reply (the flush's own completion, with no loop callback in between), times its
    request and writes every answer ready at the head, together in one write. Before, a writer task per connection
    took the answers from a queue: each answer then cost a queue hand-off, a task wake-up
    for the queue and another for the future, and a separate timing callback, all on the
    one event loop that many small producers saturate.
    """

    __slots__ = ("server", "conn", "queue", "closed", "_room", "_written", "_clock")

    def __init__(self, server: "KafkaServer", conn: Connection):
        self.server = server
        self.conn = conn
        # The loop's clock, looked up once: asyncio.get_running_loop() costs a getpid()
        # system call, once per answer otherwise.
        self._clock = asyncio.get_running_loop().time
        # answers and futures of answers, in request order
        self.queue: collections.deque = collections.deque()
        self.closed = False  # gone: answers still completing are dropped
        self._room: asyncio.Future | None = None  # the reader waits for fewer answers in flight
        self._written: asyncio.Future | None = None  # the reader waits for every answer to go out

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, reply: Any, api_key: int = -1, started: float = 0.0) -> None:
        """The answer to the next request, or a future or `Reply` of it (timed when it completes)."""
        queue = self.queue
        queue.append(reply)
        if type(reply) is Reply:
            if not reply.finished:
                reply.on_done = functools.partial(self._reply_done, api_key, started)
                return
            self._reply_done(api_key, started, reply)
            return
        if isinstance(reply, asyncio.Future):
            if not reply.done():
                reply.add_done_callback(functools.partial(self._ready, api_key, started))
                return
            self._time(reply, api_key, started)
        # Otherwise the head is a future not done yet (or whose callback is due): it writes.
        if len(queue) == 1:
            self._write_ready()

    def _time(self, reply: asyncio.Future, api_key: int, started: float) -> None:
        stats = self.server.request_stats
        if reply.cancelled() or reply.exception() is not None:
            stats.failed(api_key)
        else:
            stats.observe(api_key, time.perf_counter() - started)

    def _reply_done(self, api_key: int, started: float, reply: Reply) -> None:
        """A `Reply` finished (from the call that finished it): timed, and written with the
        answers ready behind it when it is the oldest."""
        if reply.failure is not None:
            self.server.request_stats.failed(api_key)
        else:
            self.server.request_stats.observe(api_key, time.perf_counter() - started)
        queue = self.queue
        if queue and queue[0] is reply and not self.closed:
            self._write_ready()

    def _ready(self, api_key: int, started: float, reply: asyncio.Future) -> None:
        self._time(reply, api_key, started)
        queue = self.queue
        if queue and queue[0] is reply and not self.closed:
            self._write_ready()

    def _write_ready(self) -> None:
        """Write the answers ready at the head of the queue (those covered by one fsync go
        out together: on loopback and small answers the send is a good part of a request's
        cost)."""
        queue, conn = self.queue, self.conn
        writer = conn.writer
        # A client gone with requests still in flight: its answers are dropped (asyncio
        # would log a warning for every write).
        closing = writer.transport.is_closing()
        chunks: list = []
        while queue:
            item = queue[0]
            if type(item) is Reply:
                if not item.finished:
                    break
                if item.failure is not None:
                    exc = None if isinstance(item.failure, asyncio.CancelledError) else item.failure
                    log.error("deferred response for %s failed; closing", conn.peer, exc_info=exc)
                    self._flush(chunks, closing)
                    self.close()
                    writer.close()
                    return
                item = item.result
            elif isinstance(item, asyncio.Future):
                if not item.done():
                    break
                if item.cancelled() or item.exception() is not None:
                    exc = None if item.cancelled() else item.exception()
                    log.error("deferred response for %s failed; closing", conn.peer, exc_info=exc)
                    self._flush(chunks, closing)
                    self.close()
                    writer.close()
                    return
                item = item.result()
            queue.popleft()
            conn.in_progress -= 1
            if item is not None and not closing:
                if isinstance(item, list):
                    chunks.extend(item)  # a fetch answer (record batches uncopied)
                else:
                    chunks.append(item)
                if len(chunks) >= _MAX_COALESCED:
                    self._flush(chunks, closing)
                    chunks = []
        self._flush(chunks, closing)
        conn.last_active = self._clock()
        self._wake()

    def _flush(self, chunks: list, closing: bool) -> None:
        if chunks and not closing:
            writer = self.conn.writer
            if len(chunks) == 1:
                writer.write(chunks[0])
            else:
                writer.writelines(chunks)

    def _wake(self) -> None:
        room = self._room
        if room is not None and len(self.queue) < MAX_IN_FLIGHT:
            self._room = None
            if not room.done():
                room.set_result(None)
        written = self._written
        if written is not None and not self.queue:
            self._written = None
            if not written.done():
                written.set_result(None)

    async def room(self) -> None:
        """Until fewer than MAX_IN_FLIGHT answers are outstanding."""
        while len(self.queue) >= MAX_IN_FLIGHT and not self.closed:
            self._room = asyncio.get_running_loop().create_future()
            await self._room

    async def all_written(self) -> None:
        """Until every answer is written (or dropped: the client is gone)."""
        while self.queue and not self.closed:
            self._written = asyncio.get_running_loop().create_future()
            await self._written

    def close(self) -> None:
        """Nothing more is written; answers still completing are dropped."""
        self.closed = True
        self.queue.clear()
        self._wake()
        for waiter in (self._room, self._written):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


class KafkaServer:
    def __init__(self, broker: "Broker"):
        self.broker = broker
        # Called with the peer ("host:port") of each connection that ends (share sessions are
        # tied to their connection, as in Kafka).
        self.connection_closed_hooks: list = []
        self._server: asyncio.base_events.Server | None = None
        self._connections: dict[asyncio.Task, Connection] = {}
        self._sweeper: asyncio.Task | None = None
        # The PLAINTEXT listener's compiled I/O thread (broker/netio.py), when in use.
        self._thread_listener = None
        self.idle_closed = 0
        # Per Kafka API: request latency (read to response ready) and failed requests.
        self.request_stats = RequestStats()
        # TLS on the listener (security.protocol SSL or SASL_SSL); built in start().
        self.tls = None
        # SASL outcomes by (mechanism, "authenticated" | "reauthenticated" | "failed"), and
        # TLS handshakes that failed or timed out (the /metrics page shows both).
        self.auth_counts: Counter = Counter()
        self.tls_handshake_failures = 0

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def start(self, host: str, port: int) -> int:
        # backlog: a burst of new clients (hundreds of producers starting together) must not
        # overflow the accept queue, or their SYNs are dropped and retried a second later.
        sec = self.broker.config.security
        if sec.kafka_tls:
            from fluvial.security.tls import server_context
            self.tls = server_context(sec)
        from fluvial.broker import netio
        if self.broker.config.kafka_io == "thread" and self.tls is None and not sec.kafka_sasl \
                and netio.available():
            # Socket I/O on a compiled thread, the loop woken once per batch of frames.
            self._thread_listener = netio.ThreadListener(self)
            bound = await self._thread_listener.start(host, port)
        else:
            # Frame readers: a large request is received straight into its own buffer (broker/frames.py).
            self._server = await frames.start_server(self._on_connection, host, port, limit=1 << 20, backlog=4096)
            bound = self._server.sockets[0].getsockname()[1]
        if self.broker.config.connections_max_idle_ms > 0:
            self._sweeper = asyncio.create_task(self._close_idle(), name="idle-connections")
        return bound

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._thread_listener is not None:
            await self._thread_listener.stop()
            return
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _close_idle(self) -> None:
        max_idle_s = self.broker.config.connections_max_idle_ms / 1000
        # Checked ten times per idle period (at most every 30 s): a connection is closed
        # between max_idle and 1.1 x max_idle after its last activity.
        interval = min(max(max_idle_s / 10, 0.05), 30.0)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            deadline = loop.time() - max_idle_s
            for conn in list(self._connections.values()):
                if conn.in_progress == 0 and conn.last_active < deadline:
                    log.debug("closing connection from %s: idle for over %d ms", conn.peer,
                              self.broker.config.connections_max_idle_ms)
                    self.idle_closed += 1
                    # The reader then sees end of stream and the connection's task cleans up.
                    conn.writer.transport.abort()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        peer = writer.get_extra_info("peername")
        peer_s = f"{peer[0]}:{peer[1]}" if peer else "?"
        conn = Connection(peer_s, writer, asyncio.get_running_loop().time())
        self._connections[task] = conn
        answers = Answers(self, conn)
        if self.tls is not None or self.broker.config.security.kafka_sasl:
            try:
                secured = await secure_connection(self, conn, self.tls)
            except asyncio.CancelledError:
                secured = False
            if not secured:
                self._connections.pop(task, None)
                writer.transport.abort()
                return
        cancelled = False
        try:
            await self._read_requests(reader, answers, conn)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except CloseConnection as exc:
            log.info("closing connection from %s: %s", peer_s, exc)
        except Exception:
            # A fault of the broker's own (a handler's is caught in _dispatch): the
            # connection is closed; it must not reach asyncio's stream callback.
            log.exception("connection from %s failed", peer_s)
        except asyncio.CancelledError:
            # Only stop() cancels a connection's task. It ends quietly: asyncio's stream
            # callback would log a cancelled connection task as an error with a traceback.
            cancelled = True
        finally:
            if not cancelled:
                try:
                    # The answers of the requests read so far still go out (a client that
                    # half-closed after its last request gets them), then the connection closes.
                    await answers.all_written()
                except asyncio.CancelledError:
                    pass
            answers.close()
            writer.close()
            self._connections.pop(task, None)
            self.connection_ended(peer_s)

    def connection_ended(self, peer: str) -> None:
        """Tell the connection-closed hooks (both socket I/O paths call it)."""
        for hook in self.connection_closed_hooks:
            try:
                hook(peer)
            except Exception:  # noqa: BLE001 - one hook's fault must not stop the others
                log.exception("connection-closed hook failed")

    def answered(self, answers: Answers, conn: Connection, frame: memoryview, reply: Any, started: float) -> None:
        """A request's reply into its connection's answers (a future is timed when it
        completes; no reply ends the request here), shared by both socket I/O paths."""
        stats = self.request_stats
        if reply is None:
            stats.observe(_api_key(frame), time.perf_counter() - started)
            conn.in_progress -= 1
            conn.last_active = asyncio.get_running_loop().time()
        elif type(reply) is Reply or isinstance(reply, asyncio.Future):
            answers.add(reply, _api_key(frame), started)
        else:
            stats.observe(_api_key(frame), time.perf_counter() - started)
            answers.add(reply)

    def refused(self, answers: Answers, conn: Connection, frame: memoryview, exc: CloseConnection) -> None:
        """A request answered by closing the connection: its last reply (if any) still goes out."""
        self.request_stats.failed(_api_key(frame))
        if exc.reply is not None:
            answers.add(exc.reply)
        else:
            conn.in_progress -= 1

    async def _read_requests(self, reader: asyncio.StreamReader, answers: Answers, conn: Connection) -> None:
        max_bytes = self.broker.config.max_request_bytes
        loop = asyncio.get_running_loop()
        writer = conn.writer
        while True:
            if len(answers) >= MAX_IN_FLIGHT:
                await answers.room()
            if writer.transport.get_write_buffer_size() > _WRITE_BACKLOG:
                await writer.drain()
            if answers.closed:
                return
            auth = conn.auth
            # A request already received whole is taken at once (within the same limits).
            buffered = reader.take_buffered_frame(max_bytes if auth is None else min(max_bytes, auth.max_receive))
            if buffered is not None:
                frame = memoryview(buffered)
            else:
                (size,) = _SIZE.unpack(await reader.readexactly(4))
                if size < 0 or size > max_bytes:
                    raise CloseConnection(f"request of {size} bytes is larger than max.request.bytes={max_bytes}")
                auth = conn.auth
                if auth is not None and size > auth.max_receive:
                    # Before authentication a client may not make the broker buffer much (Kafka's
                    # sasl.server.max.receive.size).
                    raise CloseConnection(f"request of {size} bytes before SASL authentication completed "
                                          f"(at most {auth.max_receive})")
                # A request still arriving does not count as in progress: a client that stops
                # half-way is closed when idle, and the partial request's buffer freed.
                frame = memoryview(await reader.read_frame(size))
            conn.in_progress += 1
            conn.last_active = loop.time()
            started = time.perf_counter()
            try:
                if auth is None:
                    reply = await self._dispatch(frame, conn.peer, started)
                else:
                    reply = await auth.dispatch(self, frame, conn, started)
            except CloseConnection as exc:
                self.refused(answers, conn, frame, exc)
                raise
            self.answered(answers, conn, frame, reply, started)

    async def _dispatch(self, frame: memoryview, peer: str, started: float, principal: Principal = ANONYMOUS
                        ) -> bytes | list[bytes] | Awaitable[bytes | None] | None:
        got = self.dispatch_now(frame, peer, principal)
        return await got if type(got) is types.CoroutineType else got

    def dispatch_now(self, frame: memoryview, peer: str, principal: Principal = ANONYMOUS) -> Any:
        """The request's answer (a `Reply` or chunks) when `produce_one` gives it: called
        in place, with no coroutine. Any other request: the coroutine that answers it (as
        `_dispatch`), for the caller to run. CloseConnection when produce_one fails."""
        got = produce_request.read_common(frame)
        if got is not None:
            # The request of many small producers (one partition), read in one compiled call;
            # its body's objects are made only when the general path takes it.
            header = produce_request.common_header(got)
            try:
                done = produce_one(self.broker, header, got[5], got[7], got[8], frame[got[9]:got[9] + got[10]])
            except Exception as exc:
                log.exception("handler of API %d v%d failed", header.api_key, header.api_version)
                raise CloseConnection(f"internal error: {exc!r}") from None
            if done is not None:
                # Its usual shape, answered without the general produce path (see produce_one).
                return done.awaitable if type(done) is Deferred else done.chunks
            return self._handle(header, HANDLERS[ApiKey.PRODUCE], produce_request.common_body(frame, got), peer,
                                principal)
        return self._decode_and_handle(frame, peer, principal)

    async def _decode_and_handle(self, frame: memoryview, peer: str, principal: Principal
                                 ) -> bytes | list[bytes] | Awaitable[bytes | None] | None:
        try:
            header = decode_request_header(frame)
        except FluvialError as exc:
            raise CloseConnection(str(exc)) from None
        reg = HANDLERS.get(header.api_key)
        if reg is None:
            raise CloseConnection(f"unknown API key {header.api_key}")
        if not reg.min_version <= header.api_version <= reg.max_version:
            if header.api_key == ApiKey.API_VERSIONS:
                return encode_api_versions_unsupported(header, supported_versions())
            raise CloseConnection(
                f"unsupported version {header.api_version} of API {header.api_key} "
                f"(supported {reg.min_version}-{reg.max_version})")
        try:
            if header.api_key == ApiKey.PRODUCE and produce_request.FIRST_VERSION <= header.api_version \
                    <= produce_request.LAST_VERSION:
                # Produce requests of other shapes: decoded by hand too.
                request = produce_request.decode_produce_request(frame[header.header_size:], header.api_version)
            else:
                request = decode_request_body(header, frame)
        except Exception as exc:  # noqa: BLE001 - a decoder failure is a malformed request
            if not isinstance(exc, FluvialError):
                exc = InvalidRequestError(f"malformed request: {type(exc).__name__}: {exc}")
            # A request that cannot be read: answered with INVALID_REQUEST where the API's
            # response has a top-level error code, else the connection is closed (Kafka's
            # answer to a request it cannot parse). Logged without a traceback: the fault
            # is the client's.
            reply = error_response(header, ErrorCode.INVALID_REQUEST)
            if reply is None:
                raise CloseConnection(str(exc)) from None
            log.info("invalid request from %s (API %d v%d): %s", peer, header.api_key, header.api_version, exc)
            return reply
        return await self._handle(header, reg, request, peer, principal)

    async def _handle(self, header: RequestHeader, reg, request, peer: str, principal: Principal
                      ) -> bytes | list[bytes] | Awaitable[bytes | None] | None:
        ctx = RequestContext(self.broker, header, peer, principal)
        try:
            result = await reg.handler(ctx, request)
        except FluvialError as exc:
            raise CloseConnection(f"{type(exc).__name__}: {exc}") from None
        except Exception as exc:
            log.exception("handler of API %d v%d failed", header.api_key, header.api_version)
            raise CloseConnection(f"internal error: {exc!r}") from None
        if result is None:
            return None
        if isinstance(result, Deferred):
            if type(result.awaitable) is Reply or isinstance(result.awaitable, asyncio.Future):
                # Completed by a callback with the framed answer (bytes) or None: nothing to
                # convert, so no task to wrap it in; timed by the connection's Answers.
                return result.awaitable
            return asyncio.ensure_future(self._complete(header, result.awaitable))
        if isinstance(result, EncodedResponse):
            # Framed by the handler (Fetch): written as chunks, the record batches uncopied.
            return result.chunks
        return encode_response(header, result)

    @staticmethod
    async def _complete(header: RequestHeader, awaitable: Awaitable[Any]) -> bytes | list | None:
        response = await awaitable
        if response is None or isinstance(response, (bytes, bytearray)):
            return response  # None: nothing to send; bytes: framed by the handler
        if isinstance(response, EncodedResponse):
            return response.chunks
        return encode_response(header, response)
