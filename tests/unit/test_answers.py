"""A connection's answers (broker/server.py `Answers`) over a real loopback connection:
written strictly in request order whatever order their futures complete in, the ready
ones together, each request timed once; a failed answer closes the connection after the
answers before it; answers of a closed connection are dropped."""
from __future__ import annotations

import asyncio
import socket

from fluvial.broker.handlers import Reply
from fluvial.broker.request_stats import RequestStats
from fluvial.broker.server import MAX_IN_FLIGHT, Answers, Connection


class _Server:
    def __init__(self) -> None:
        self.request_stats = RequestStats()


async def _pair():
    a, b = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=a)
    reader, peer_writer = await asyncio.open_connection(sock=b)
    conn = Connection("test", writer, 0.0)
    server = _Server()
    return server, conn, Answers(server, conn), reader, peer_writer


async def _read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    return await asyncio.wait_for(reader.readexactly(n), 5)


def test_answers_go_out_in_request_order_whatever_order_they_complete_in():
    async def scenario():
        server, conn, answers, reader, _ = await _pair()
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(4)]
        conn.in_progress = 7
        answers.add(b"a0")                      # ready at once: written at once
        assert await _read_exactly(reader, 2) == b"a0"
        answers.add(futures[0], 0, 0.0)
        answers.add(b"a2")
        answers.add(futures[1], 0, 0.0)
        answers.add(futures[2], 0, 0.0)
        answers.add([b"a", b"6"])               # a fetch's chunks
        answers.add(futures[3], 0, 0.0)
        futures[2].set_result(b"a5")
        futures[1].set_result(None)             # nothing to send for this one
        futures[3].set_result(b"a7")
        await asyncio.sleep(0.05)
        assert len(answers) == 6                # all wait for the first
        futures[0].set_result(b"a1")
        assert await _read_exactly(reader, 10) == b"a1a2a5a6a7"
        await asyncio.sleep(0)
        assert len(answers) == 0 and conn.in_progress == 0
        assert server.request_stats.latency[0].count == 4  # each future timed once
        await answers.all_written()

    asyncio.run(scenario())


def test_a_failed_answer_closes_the_connection_after_the_answers_before_it():
    async def scenario():
        server, conn, answers, reader, _ = await _pair()
        loop = asyncio.get_running_loop()
        first, failing, after = loop.create_future(), loop.create_future(), loop.create_future()
        conn.in_progress = 3
        for f in (first, failing, after):
            answers.add(f, 0, 0.0)
        failing.set_exception(RuntimeError("boom"))
        first.set_result(b"ok")
        after.set_result(b"never")
        assert await _read_exactly(reader, 2) == b"ok"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing after it
        assert answers.closed and len(answers) == 0
        assert server.request_stats.failures[0] == 1
        await answers.all_written()                           # returns: nothing more goes out

    asyncio.run(scenario())


def test_the_reader_waits_for_room_and_a_closed_connection_drops_answers():
    async def scenario():
        _, conn, answers, reader, _ = await _pair()
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(MAX_IN_FLIGHT)]
        conn.in_progress = MAX_IN_FLIGHT
        for f in futures:
            answers.add(f, 0, 0.0)
        room = asyncio.ensure_future(answers.room())
        await asyncio.sleep(0.02)
        assert not room.done()                  # MAX_IN_FLIGHT answers outstanding
        futures[0].set_result(b"x")
        await asyncio.wait_for(room, 5)
        assert await _read_exactly(reader, 1) == b"x"
        answers.close()
        for f in futures[1:]:
            f.set_result(b"y")
        await asyncio.sleep(0.02)
        conn.writer.close()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # nothing written after close

    asyncio.run(scenario())


def test_replies_are_written_from_the_call_that_finishes_them_in_request_order():
    """A `Reply` (a produce's answer finished by its flush) is written by `set_result`
    itself, with the answers ready behind it, and keeps its place among futures."""
    async def scenario():
        server, conn, answers, reader, _ = await _pair()
        loop = asyncio.get_running_loop()
        first, second, future = Reply(), Reply(), loop.create_future()
        conn.in_progress = 4
        answers.add(first, 0, 0.0)
        answers.add(second, 0, 0.0)
        answers.add(future, 0, 0.0)
        answers.add(b"r3")
        second.set_result(b"r1")
        future.set_result(b"r2")
        await asyncio.sleep(0.05)
        assert len(answers) == 4                # all wait for the first
        first.set_result(b"r0")
        assert len(answers) == 0                # written from within set_result, every ready one with it
        assert await _read_exactly(reader, 8) == b"r0r1r2r3"
        assert len(answers) == 0 and conn.in_progress == 0
        assert server.request_stats.latency[0].count == 3
        done = Reply()
        done.set_result(b"r4")                  # finished before it is added: written at once
        conn.in_progress = 1
        answers.add(done, 0, 0.0)
        assert await _read_exactly(reader, 2) == b"r4"
        await answers.all_written()

    asyncio.run(scenario())


def test_a_failed_reply_closes_the_connection_after_the_answers_before_it():
    async def scenario():
        server, conn, answers, reader, _ = await _pair()
        first, failing, after = Reply(), Reply(), Reply()
        conn.in_progress = 3
        for r in (first, failing, after):
            answers.add(r, 0, 0.0)
        failing.set_failure(asyncio.CancelledError())  # the loop stopped before its flush ended
        first.set_result(b"ok")
        after.set_result(b"never")
        assert await _read_exactly(reader, 2) == b"ok"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert answers.closed and len(answers) == 0
        assert server.request_stats.failures[0] == 1

    asyncio.run(scenario())


def test_a_reply_can_be_awaited():
    async def scenario():
        reply, failed = Reply(), Reply()
        asyncio.get_running_loop().call_soon(reply.set_result, b"x")
        assert await reply == b"x"
        assert await reply == b"x"              # finished: at once
        failed.set_failure(RuntimeError("flush failed"))
        try:
            await failed
        except RuntimeError as exc:
            assert str(exc) == "flush failed"
        else:
            raise AssertionError("a failed Reply must raise")

    asyncio.run(scenario())
