"""The PLAINTEXT Kafka listener with its socket I/O on a compiled thread (broker/_netio.c).

Many small producers (one-record acks=all requests) saturated the single event loop: of
~106 µs of loop-thread CPU per request, 40-55 µs were the kernel's socket receive and send
on the loop thread plus asyncio's wake-up of each connection's reader task. Here a thread
that never holds the GIL accepts connections, reads length-prefixed frames (a frame above
max.request.bytes ends the connection, as on the asyncio path) and writes the queued
answers with writev. The event loop is woken once per batch (one eventfd watched with
``add_reader``) and takes every complete frame of every connection in one call.

Everything Kafka-specific stays here in Python, on the loop thread: requests of a
connection are handled one after another in arrival order (a handler that completes
without waiting is stepped in place, with no task; one that waits becomes a task and the
connection's next frames queue behind it), answers go out in request order through the
same `Answers` as the asyncio path, a connection stops being read while MAX_IN_FLIGHT
answers are outstanding or more than _WRITE_BACKLOG bytes are unsent, and the idle sweeper,
request statistics and connection-closed hooks see the same `Connection` objects.
TLS and SASL listeners keep the asyncio path (broker/server.py).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
import types
from typing import TYPE_CHECKING, Any, Coroutine

from fluvial.broker.server import _WRITE_BACKLOG, MAX_IN_FLIGHT, Answers, CloseConnection, Connection

try:
    from fluvial.broker import _netio
except ImportError:  # not built: every listener uses the asyncio path
    _netio = None

if TYPE_CHECKING:
    from fluvial.broker.server import KafkaServer

log = logging.getLogger("fluvial.broker.server")


def available() -> bool:
    """Whether the compiled I/O thread is built."""
    return _netio is not None


@types.coroutine
def _rest_of(coro: Coroutine, yielded: Any):
    """Drives a coroutine already stepped once (it yielded ``yielded``) to its end, so a
    task can take over a handler that turned out to wait."""
    while True:
        try:
            value = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # noqa: BLE001 - passed on to the handler (e.g. cancellation)
            try:
                yielded = coro.throw(exc)
            except StopIteration as done:
                return done.value
        else:
            try:
                yielded = coro.send(value)
            except StopIteration as done:
                return done.value


async def _finish(coro: Coroutine, yielded: Any) -> Any:
    return await _rest_of(coro, yielded)


class _Writer:
    """What `Answers` and the idle sweeper use of a connection's writer (and transport),
    over the I/O thread."""

    __slots__ = ("link",)

    def __init__(self, link: "_Link"):
        self.link = link

    @property
    def transport(self) -> "_Writer":
        return self

    def write(self, data: Any) -> None:
        link = self.link  # `_Link.send` written out: called for every answer
        if not (link.closing and link.close_sent):
            link.listener.queue_output(link.cid, data)

    def writelines(self, chunks: list) -> None:
        self.link.send(chunks)

    def is_closing(self) -> bool:
        return self.link.closing

    def get_write_buffer_size(self) -> int:
        return max(0, self.link.listener.io.backlog(self.link.cid))

    def close(self) -> None:
        """Close once what is queued is written."""
        self.link.listener.finish(self.link)

    def abort(self) -> None:
        """Close at once (the idle sweeper)."""
        link = self.link
        link.closing = True
        if link.listener.io is not None:
            link.listener.io.close(link.cid, False)


class _LinkAnswers(Answers):
    """`Answers` that tell the connection when answers went out (instead of waking a reader task)."""

    __slots__ = ("link",)

    def _wake(self) -> None:
        self.link.listener.progress(self.link)


class _Link:
    """One connection of the thread listener."""

    __slots__ = ("listener", "cid", "conn", "answers", "frames", "busy", "task", "eof", "closing",
                 "close_sent", "backlogged", "paused", "stepping")

    def __init__(self, listener: "ThreadListener", cid: int, peer: str):
        self.listener = listener
        self.cid = cid
        self.conn = Connection(peer, _Writer(self), asyncio.get_running_loop().time())
        self.answers = _LinkAnswers(listener.server, self.conn)
        self.answers.link = self
        self.frames: collections.deque = collections.deque()  # received, waiting their turn
        self.busy = False  # a handler of this connection is waiting (as a task)
        self.task: asyncio.Task | None = None
        self.eof = False  # the client sent no more (or reading ended)
        self.closing = False  # no more requests are handled; closed once the answers are out
        self.close_sent = False
        self.backlogged = False  # over _WRITE_BACKLOG bytes unsent: not read until drained
        self.paused = False  # what the I/O thread was last told
        self.stepping = False  # the frame queue is being worked through (no re-entry)

    def send(self, data: Any) -> None:
        if self.closing and self.close_sent:
            return
        self.listener.queue_output(self.cid, data)


class ThreadListener:
    """Accepts and serves the Kafka connections of one PLAINTEXT listener."""

    def __init__(self, server: "KafkaServer"):
        self.server = server
        self.io = None
        self._links: dict[int, _Link] = {}
        self._sockets: list[socket.socket] = []
        # Answers written during one step of the loop, handed to the thread together at its
        # end (one lock and one wake-up of the thread for all of them).
        self._outbox: list = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self, host: str, port: int) -> int:
        loop = self._loop = asyncio.get_running_loop()
        # Bound as asyncio's create_server binds (every address of the host, SO_REUSEADDR,
        # v6 sockets v6-only), the thread accepting.
        infos = await loop.getaddrinfo(host or None, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        self.io = _netio.IOThread(self.server.broker.config.max_request_bytes)
        try:
            for family, type_, proto, _, address in dict.fromkeys(infos):
                sock = socket.socket(family, type_, proto)
                self._sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                # backlog: hundreds of producers starting together must not overflow the accept queue
                sock.listen(4096)
                self.io.add_listener(sock.fileno())
        except OSError:
            for sock in self._sockets:
                sock.close()
            self.io = None
            raise
        loop.add_reader(self.io.fileno(), self._on_events)
        self.io.start()
        log.info("Kafka listener socket I/O: compiled I/O thread (--kafka-io thread)")
        return self._sockets[0].getsockname()[1]

    async def stop(self) -> None:
        io = self.io
        if io is None:
            return
        io.stop()
        self._loop.remove_reader(io.fileno())
        tasks = [link.task for link in self._links.values() if link.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for link in list(self._links.values()):
            self._closed(link)
        for sock in self._sockets:
            sock.close()
        self.io = None  # frees the thread's connections (their sockets close)

    # --- output

    def queue_output(self, cid: int, data: Any) -> None:
        outbox = self._outbox
        if not outbox:
            self._loop.call_soon(self._flush_output)
        outbox.append((cid, data))

    def _flush_output(self) -> None:
        outbox, self._outbox = self._outbox, []
        if self.io is None:
            return
        for cid in self.io.send_many(outbox, _WRITE_BACKLOG):
            # Over _WRITE_BACKLOG bytes unsent: no further request is read until the client
            # has taken most of it (a slow consumer of large fetches).
            link = self._links.get(cid)
            if link is not None and not link.backlogged:
                link.backlogged = True
                self.io.watch_drain(cid, _WRITE_BACKLOG // 4)
                self.update_pause(link)

    # --- events from the I/O thread (one call per wake-up)

    def _on_events(self) -> None:
        io = self.io
        if io is None:
            return
        links = self._links
        for kind, cid, payload in io.poll():
            if kind == 2:  # a frame
                link = links.get(cid)
                if link is None or link.closing:
                    continue
                if link.frames or link.busy or link.backlogged or len(link.answers) >= MAX_IN_FLIGHT:
                    link.frames.append(payload)
                    self.update_pause(link)
                else:
                    self._handle(link, payload)
                    if link.busy or len(link.answers) >= MAX_IN_FLIGHT:
                        self.update_pause(link)
            elif kind == 1:  # accepted
                link = links[cid] = _Link(self, cid, payload)
                self.server._connections[cid] = link.conn
            elif kind == 3:  # end of stream (or reading ended: why, when the broker ended it)
                link = links.get(cid)
                if link is None:
                    continue
                link.eof = True
                if payload:
                    log.info("closing connection from %s: %s", link.conn.peer, payload)
                self._drain(link)
            elif kind == 4:  # answers drained below the back-pressure mark
                link = links.get(cid)
                if link is not None:
                    link.backlogged = False
                    self._drain(link)
            elif kind == 5:  # closed
                link = links.get(cid)
                if link is not None:
                    self._closed(link)
        if self._outbox:
            self._flush_output()  # the answers of this batch go out now, not a loop step later

    # --- requests

    def _handle(self, link: _Link, frame: Any) -> None:
        """Handle one request: in place when its handler does not wait, else as a task."""
        conn = link.conn
        server = self.server
        conn.in_progress += 1
        conn.last_active = self._loop.time()
        started = time.perf_counter()
        view = memoryview(frame)
        try:
            coro = server.dispatch_now(view, conn.peer)
        except BaseException as exc:  # noqa: BLE001 - as below
            self._failed(link, view, exc)
            return
        if type(coro) is not types.CoroutineType:
            # Answered in place (produce_one): no coroutine was made.
            server.answered(link.answers, conn, view, coro, started)
            return
        try:
            yielded = coro.send(None)
        except StopIteration as done:
            self.server.answered(link.answers, link.conn, view, done.value, started)
            return
        except BaseException as exc:  # noqa: BLE001 - what the asyncio path's reader catches
            self._failed(link, view, exc)
            return
        link.busy = True
        task = link.task = asyncio.ensure_future(_finish(coro, yielded))
        task.add_done_callback(lambda t: self._resumed(link, view, started, t))

    def _resumed(self, link: _Link, view: memoryview, started: float, task: asyncio.Task) -> None:
        link.busy = False
        link.task = None
        if task.cancelled():
            return  # stop()
        exc = task.exception()
        if exc is not None:
            self._failed(link, view, exc)
        else:
            self.server.answered(link.answers, link.conn, view, task.result(), started)
        self._drain(link)

    def _failed(self, link: _Link, view: memoryview, exc: BaseException) -> None:
        conn = link.conn
        if isinstance(exc, CloseConnection):
            self.server.refused(link.answers, conn, view, exc)
            log.info("closing connection from %s: %s", conn.peer, exc)
        elif isinstance(exc, Exception):
            # A fault of the broker's own (a handler's is caught in _dispatch): the connection closes.
            conn.in_progress -= 1
            log.error("connection from %s failed", conn.peer, exc_info=exc)
        else:
            conn.in_progress -= 1
        link.frames.clear()
        self.finish(link)

    def _drain(self, link: _Link) -> None:
        """Handle the connection's waiting frames while it may, then pause or resume its reading."""
        if link.stepping:
            return
        link.stepping = True
        try:
            frames, answers = link.frames, link.answers
            while frames and not link.busy and not link.closing and not link.backlogged \
                    and len(answers) < MAX_IN_FLIGHT:
                self._handle(link, frames.popleft())
        finally:
            link.stepping = False
        if link.eof and not link.frames and not link.busy:
            self.finish(link)
        elif link.closing:
            self.progress(link)
        else:
            self.update_pause(link)

    def progress(self, link: _Link) -> None:
        """Answers went out (or were dropped): room for more requests, or the end."""
        if link.closing:
            if not link.close_sent and (not link.answers.queue or link.answers.closed):
                link.close_sent = True
                if self.io is not None:
                    self._flush_output()  # its last answers go first
                    self.io.close(link.cid, True)
            return
        if link.frames:
            self._drain(link)
        elif link.paused:
            self.update_pause(link)

    def update_pause(self, link: _Link) -> None:
        paused = link.closing or link.backlogged \
            or len(link.answers) + len(link.frames) >= MAX_IN_FLIGHT
        if paused != link.paused and self.io is not None:
            link.paused = paused
            self.io.pause(link.cid, paused)

    def finish(self, link: _Link) -> None:
        """No more requests: the answers of those read so far still go out, then it closes."""
        if not link.closing:
            link.closing = True
            self.update_pause(link)
        self.progress(link)

    def _closed(self, link: _Link) -> None:
        self._links.pop(link.cid, None)
        link.closing = link.close_sent = True
        link.frames.clear()
        link.answers.close()
        if link.task is not None:
            link.task.cancel()
        self.server._connections.pop(link.cid, None)
        self.server.connection_ended(link.conn.peer)
