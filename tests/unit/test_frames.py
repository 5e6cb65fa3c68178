"""Frame reading (broker/frames.py) over a real loopback connection: every frame arrives
whole and in order however the bytes are split, large frames land in their own writable
buffer, and a connection closed mid-frame ends the read with IncompleteReadError; on
asyncio's loop (bytes received into the protocol's buffers) and on uvloop's (bytes handed
over), and whether frames already buffered are taken at once or read the long way."""
from __future__ import annotations

import asyncio
import os
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fluvial.broker import event_loop, frames

LOOPS = ["asyncio"] + (["uvloop"] if event_loop.uvloop_available() else [])


async def _next_frame(reader: frames.FrameReader, take_buffered: bool) -> bytearray:
    """The next frame, as the Kafka listener reads it (taken whole when buffered) or the long way."""
    if take_buffered:
        frame = reader.take_buffered_frame(1 << 30)
        if frame is not None:
            return frame
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.read_frame(size)


async def _serve(handler):
    server = await frames.start_server(handler, "127.0.0.1", 0, limit=1 << 20)
    return server, server.sockets[0].getsockname()[1]


def _framed(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("take_buffered", [False, True])
def test_frames_arrive_whole_in_any_split(loop, take_buffered):
    rng = random.Random(7)
    sizes = [0, 1, 5, 4096, frames.DIRECT_FRAME_BYTES - 1, frames.DIRECT_FRAME_BYTES, 200_000, 3, 1_500_000, 17,
             frames.DIRECT_FRAME_BYTES + 1, 64 * 1024, 10]
    payloads = [os.urandom(n) for n in sizes]
    stream = _framed(payloads)

    async def run():
        received: list[bytearray] = []
        done = asyncio.Event()

        async def handler(reader: frames.FrameReader, writer):
            try:
                while True:
                    received.append(await _next_frame(reader, take_buffered))
            except asyncio.IncompleteReadError:
                pass
            finally:
                writer.close()
                done.set()

        server, port = await _serve(handler)
        _, w = await asyncio.open_connection("127.0.0.1", port)
        pos = 0
        while pos < len(stream):
            n = rng.choice((1, 3, 100, 7000, 65536, 300_000))
            w.write(stream[pos:pos + n])
            await w.drain()
            pos += n
            if rng.random() < 0.3:
                await asyncio.sleep(0)
        w.close()
        await asyncio.wait_for(done.wait(), 20)
        server.close()
        await server.wait_closed()
        return received

    received = event_loop.run(run(), loop)
    assert [bytes(r) for r in received] == payloads
    assert all(isinstance(r, bytearray) for r in received)  # the handler may patch them in place


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("size", [100, 1_000_000])
def test_connection_closed_mid_frame(size, loop):
    async def run():
        outcome: list[BaseException | bytearray] = []
        done = asyncio.Event()

        async def handler(reader, writer):
            try:
                outcome.append(await _next_frame(reader, True))
            except BaseException as exc:  # noqa: BLE001 - the test looks at what it was
                outcome.append(exc)
            finally:
                writer.close()
                done.set()

        server, port = await _serve(handler)
        _, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(struct.pack(">i", size) + b"x" * (size // 2))
        await w.drain()
        await asyncio.sleep(0.05)
        w.close()
        await asyncio.wait_for(done.wait(), 10)
        server.close()
        await server.wait_closed()
        return outcome

    (outcome,) = event_loop.run(run(), loop)
    assert isinstance(outcome, asyncio.IncompleteReadError)
    assert outcome.expected == size and len(outcome.partial) == size // 2


def _round_trip(payloads: list[bytes], chunks: list[int], loop: str = "asyncio",
                take_buffered: bool = False) -> list[bytes]:
    """Send the framed payloads in chunks of the given sizes (cycled); the frames read back."""
    stream = _framed(payloads)

    async def run():
        received: list[bytes] = []
        done = asyncio.Event()

        async def handler(reader: frames.FrameReader, writer):
            try:
                while True:
                    received.append(bytes(await _next_frame(reader, take_buffered)))
            except asyncio.IncompleteReadError:
                pass
            finally:
                writer.close()
                done.set()

        server, port = await _serve(handler)
        _, w = await asyncio.open_connection("127.0.0.1", port)
        pos, i = 0, 0
        while pos < len(stream):
            n = chunks[i % len(chunks)]
            w.write(stream[pos:pos + n])
            await w.drain()
            pos, i = pos + n, i + 1
        w.close()
        await asyncio.wait_for(done.wait(), 20)
        server.close()
        await server.wait_closed()
        return received

    return event_loop.run(run(), loop)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.sampled_from([0, 1, 4, 100, frames.DIRECT_FRAME_BYTES - 1, frames.DIRECT_FRAME_BYTES,
                                       70_000, 300_000]) | st.integers(0, 100_000), min_size=1, max_size=6),
       chunks=st.lists(st.integers(1, 400_000), min_size=1, max_size=5),
       loop=st.sampled_from(LOOPS), take_buffered=st.booleans())
def test_any_frames_in_any_chunks(sizes, chunks, loop, take_buffered):
    payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    assert _round_trip(payloads, chunks, loop, take_buffered) == payloads


def test_a_buffered_frame_over_the_limit_is_left_for_the_checked_path():
    """take_buffered_frame never takes a frame larger than the limit (or a negative size):
    it leaves the bytes for the listener's own read, which refuses them with its error."""
    async def main():
        reader = frames.FrameReader(1 << 20, asyncio.get_running_loop())
        reader.feed_data(struct.pack(">i", 10) + b"x" * 10 + struct.pack(">i", -1) + b"y")
        assert reader.take_buffered_frame(9) is None
        assert bytes(reader.take_buffered_frame(10)) == b"x" * 10
        assert reader.take_buffered_frame(1 << 30) is None
        assert await reader.readexactly(5) == struct.pack(">i", -1) + b"y"
    asyncio.run(main())


def test_event_loop_choice():
    assert event_loop.resolve("asyncio") == "asyncio"
    assert event_loop.resolve("auto", debug=True) == "asyncio"
    assert event_loop.resolve("auto", tls=True) == "asyncio"
    assert event_loop.resolve("auto") == ("uvloop" if event_loop.uvloop_available() else "asyncio")
    with pytest.raises(ValueError):
        event_loop.resolve("trio")

    async def name():
        return event_loop.running_loop_name()
    for loop in LOOPS:
        assert event_loop.run(name(), loop) == loop


def test_idle_connections_share_one_receive_buffer():
    """An idle connection must not hold a receive buffer of its own: 5,000 of them at
    256 KB each cost 1.3 GB. The readers of one loop thread share one."""
    async def main():
        loop = asyncio.get_running_loop()
        readers = [frames.FrameReader(1 << 20, loop) for _ in range(100)]
        buffers = {id(r.get_buffer().obj) for r in readers}
        assert len(buffers) == 1
    asyncio.run(main())
