"""Reading Kafka request frames off a connection with one copy of their bytes.

asyncio's stream reader moves every byte of a request four times before a handler sees it
(the socket's ``recv`` into a fresh bytes object, appended to the reader's buffer, sliced
out, copied again into ``bytes``), and a produce handler then copied the batch once more
to patch its base offset. For a 1 MB produce request those copies, on fresh pages each,
were the largest cost of the raw produce path (see docs/architecture.md, "The path of a
produce").

Here the connection's protocol is a buffered one: once the size of a large frame is
known, the socket receives straight into a buffer of exactly that size (``recv_into``),
which becomes the frame the handlers read, writable, so the produce handler patches and
caches the batch in place. Small frames (a few KB: many small producers) still go through
the reader's shared buffer, as one slice each. Everything else (SASL and TLS set-up, the
writer, flow control, end of stream) is asyncio's ``StreamReader``/``StreamWriter``.
"""
from __future__ import annotations

import asyncio
import struct
import threading
from typing import Awaitable, Callable

_SIZE = struct.Struct(">i")
# Frames at least this large are received into their own buffer.
DIRECT_FRAME_BYTES = 32 * 1024
# What a single receive of small frames may take at once.
_SCRATCH_BYTES = 256 * 1024
# One receive buffer for small frames, shared by the connections of a thread's event loop:
# the transport calls get_buffer, recv_into and buffer_updated one after another in one
# callback, and buffer_updated copies the bytes out at once, so no two connections use it
# at the same time. A buffer per connection cost 256 KB per idle connection (1.3 GB RSS
# for 5,000 of them).
_scratch_by_thread = threading.local()


def _scratch() -> memoryview:
    scratch = getattr(_scratch_by_thread, "buffer", None)
    if scratch is None:
        scratch = _scratch_by_thread.buffer = memoryview(bytearray(_SCRATCH_BYTES))
    return scratch


class FrameReader(asyncio.StreamReader):
    """A ``StreamReader`` with ``read_frame``: the next ``n`` bytes as a bytearray the
    caller owns. Large frames are received directly into that bytearray."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self._frame: memoryview | None = None  # the large frame being received
        self._filled = 0
        self._into_frame = False
        self._scratch = _scratch()

    # --- the protocol side (asyncio.BufferedProtocol, through FrameProtocol)

    def get_buffer(self) -> memoryview:
        # A complete frame not yet taken by read_frame: more bytes go to the shared buffer.
        self._into_frame = self._frame is not None and self._filled < len(self._frame)
        return self._frame[self._filled:] if self._into_frame else self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._into_frame:
            self._filled += nbytes
            if self._filled == len(self._frame):
                self._wakeup_waiter()
            return
        self.feed_data(self._scratch[:nbytes])

    def data_received(self, data: bytes) -> None:
        """The same for a loop that hands over received bytes instead of receiving into the
        protocol's buffers: uvloop does so for any ``asyncio.Protocol`` subclass, which
        ``StreamReaderProtocol`` is. The bytes of a large frame being received are copied
        into it, the rest go to the reader's buffer."""
        frame = self._frame
        if frame is not None and self._filled < len(frame):
            take = min(len(data), len(frame) - self._filled)
            frame[self._filled:self._filled + take] = memoryview(data)[:take]
            self._filled += take
            if self._filled == len(frame):
                self._wakeup_waiter()
            if take == len(data):
                return
            data = memoryview(data)[take:]
        self.feed_data(data)

    # --- the reading side

    def take_buffered_frame(self, max_size: int) -> bytearray | None:
        """The next frame (its size prefix removed) when all of it is buffered already and
        it is at most ``max_size`` bytes; else None and nothing is consumed (the caller then
        reads the size and the frame the long way, with its checks and errors). Many small
        requests arrive whole in one receive: taking them here saves two coroutine calls each."""
        buffer = self._buffer
        if len(buffer) < 4 or self._exception is not None:
            return None
        (size,) = _SIZE.unpack_from(buffer, 0)
        end = 4 + size
        if size < 0 or size > max_size or len(buffer) < end:
            return None
        if len(buffer) == end:
            # The whole buffer is the frame: handed over, not copied.
            data, self._buffer = buffer, bytearray()
            del data[:4]  # cheap: a bytearray drops its head without moving the rest
        else:
            data = buffer[4:end]
            del buffer[:end]
        self._maybe_resume_transport()
        return data

    async def read_frame(self, n: int) -> bytearray:
        """Exactly ``n`` bytes (IncompleteReadError at end of stream before that)."""
        if self._exception is not None:
            raise self._exception
        buffered = len(self._buffer)
        if buffered < n and n >= DIRECT_FRAME_BYTES:
            return await self._receive_direct(n)
        while len(self._buffer) < n:
            if self._eof:
                incomplete = bytes(self._buffer)
                self._buffer.clear()
                raise asyncio.IncompleteReadError(incomplete, n)
            await self._wait_for_data("read_frame")
        if len(self._buffer) == n:
            # The whole buffer is the frame: handed over, not copied.
            data, self._buffer = self._buffer, bytearray()
        else:
            data = self._buffer[:n]
            del self._buffer[:n]  # cheap: a bytearray drops its head without moving the rest
        self._maybe_resume_transport()
        return data

    async def _receive_direct(self, n: int) -> bytearray:
        frame = bytearray(n)
        buffered = len(self._buffer)
        frame[:buffered] = self._buffer
        self._buffer.clear()
        self._frame = memoryview(frame)
        self._filled = buffered
        try:
            while self._filled < n:
                if self._exception is not None:
                    raise self._exception
                if self._eof:
                    raise asyncio.IncompleteReadError(bytes(frame[:self._filled]), n)
                # Resumes the transport if the reader's buffer had paused it.
                await self._wait_for_data("read_frame")
        finally:
            self._frame = None
        return frame


class FrameProtocol(asyncio.StreamReaderProtocol, asyncio.BufferedProtocol):
    """asyncio's stream protocol, receiving into the buffers its ``FrameReader`` names."""

    def __init__(self, reader: FrameReader, client_connected_cb: Callable, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(reader, client_connected_cb, loop=loop)
        self._frames = reader

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._frames.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._frames.buffer_updated(nbytes)

    def data_received(self, data: bytes) -> None:
        self._frames.data_received(data)


async def start_server(client_connected_cb: Callable[[FrameReader, asyncio.StreamWriter], Awaitable[None]],
                       host: str, port: int, *, limit: int, **kwargs) -> asyncio.Server:
    """``asyncio.start_server`` with frame readers."""
    loop = asyncio.get_running_loop()

    def factory() -> FrameProtocol:
        return FrameProtocol(FrameReader(limit, loop), client_connected_cb, loop)

    return await loop.create_server(factory, host, port, **kwargs)
