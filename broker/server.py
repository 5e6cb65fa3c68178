"""The Kafka listener: reads framed requests from each connection and answers in order.

Requests of one connection are handled one after another, as Kafka does, so that
pipelined produce requests append in the order they were sent. A handler may return a
`Deferred` (a produce waiting for its fsync); the connection then goes on with the next
request while a writer task sends the responses strictly in request order.
"""
from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING, Any, Awaitable

from fluvial.broker.handlers import HANDLERS, Deferred, RequestContext, supported_versions
from fluvial.errors import FluvialError
from fluvial.protocol.fetch_response import EncodedResponse
from fluvial.protocol.messages import (ApiKey, RequestHeader, decode_request_body, decode_request_header,
                                       encode_api_versions_unsupported, encode_response)

if TYPE_CHECKING:
    from fluvial.broker.broker import Broker

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
# Responses a connection may have outstanding before it stops reading more requests.
MAX_IN_FLIGHT = 64


class CloseConnection(Exception):
    """The request cannot be answered; Kafka's reply to that is closing the connection."""


class KafkaServer:
    def __init__(self, broker: "Broker"):
        self.broker = broker
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._on_connection, host, port, limit=1 << 20)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        peer_s = f"{peer[0]}:{peer[1]}" if peer else "?"
        outbox: asyncio.Queue = asyncio.Queue(MAX_IN_FLIGHT)
        sender = asyncio.create_task(self._send_in_order(outbox, writer, peer_s))
        try:
            await self._read_requests(reader, outbox, peer_s)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except CloseConnection as exc:
            log.warning("closing connection from %s: %s", peer_s, exc)
        except asyncio.CancelledError:
            sender.cancel()
            raise
        finally:
            await outbox.put(None)
            try:
                await sender
            except (asyncio.CancelledError, Exception):
                pass
            writer.close()
            self._connections.discard(task)

    async def _read_requests(self, reader: asyncio.StreamReader, outbox: asyncio.Queue, peer: str) -> None:
        max_bytes = self.broker.config.max_request_bytes
        while True:
            (size,) = _SIZE.unpack(await reader.readexactly(4))
            if size < 0 or size > max_bytes:
                raise CloseConnection(f"request of {size} bytes is larger than max.request.bytes={max_bytes}")
            frame = memoryview(await reader.readexactly(size))
            reply = await self._dispatch(frame, peer)
            if reply is not None:
                await outbox.put(reply)

    async def _dispatch(self, frame: memoryview, peer: str) -> bytes | list[bytes] | Awaitable[bytes | None] | None:
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
            request = decode_request_body(header, frame)
        except FluvialError as exc:
            raise CloseConnection(str(exc)) from None
        ctx = RequestContext(self.broker, header, peer)
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
            return asyncio.ensure_future(self._complete(header, result.awaitable))
        if isinstance(result, EncodedResponse):
            # Framed by the handler (Fetch): written as chunks, the record batches uncopied.
            return result.chunks
        return encode_response(header, result)

    async def _complete(self, header: RequestHeader, awaitable: Awaitable[Any]) -> bytes | None:
        response = await awaitable
        return None if response is None else encode_response(header, response)

    async def _send_in_order(self, outbox: asyncio.Queue, writer: asyncio.StreamWriter, peer: str) -> None:
        while True:
            item = await outbox.get()
            if item is None:
                return
            if isinstance(item, list):
                writer.writelines(item)
                if outbox.empty() or writer.transport.get_write_buffer_size() > (4 << 20):
                    await writer.drain()
                continue
            if not isinstance(item, (bytes, bytearray)):
                try:
                    item = await item
                except Exception:
                    log.exception("deferred response for %s failed; closing", peer)
                    writer.close()
                    return
                if item is None:
                    continue
            writer.write(item)
            if outbox.empty() or writer.transport.get_write_buffer_size() > (4 << 20):
                await writer.drain()
