"""The Kafka listener's compiled I/O thread (broker/_netio.c) on real loopback sockets:
framing at every split point, oversize frames, clients leaving mid-frame, output released
when its connection closes, back-pressure, many connections."""
from __future__ import annotations

import os
import select
import socket
import struct
import time

import pytest

from fluvial.broker import netio

_netio = pytest.importorskip("fluvial.broker._netio") if netio.available() else None
ACCEPTED, FRAME, EOF, DRAINED, CLOSED = 1, 2, 3, 4, 5


def test_compiled_io_thread_is_built() -> None:
    # `pip install -e .` builds it; without it the Kafka listener falls back to asyncio's transports.
    assert netio.available()


pytestmark = pytest.mark.skipif(not netio.available(), reason="broker/_netio.c is not built")


class Harness:
    def __init__(self, max_frame: int = 1 << 20):
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.io = _netio.IOThread(max_frame)
        self.io.add_listener(self.listener.fileno())
        self.io.start()
        self.address = self.listener.getsockname()
        self.events: list = []
        self.clients: list[socket.socket] = []

    def connect(self) -> tuple[socket.socket, int]:
        c = socket.create_connection(self.address)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.clients.append(c)
        port = c.getsockname()[1]
        ev = self.wait(lambda e: e[0] == ACCEPTED and e[2].endswith(f":{port}"))
        return c, ev[1]

    def pump(self, timeout: float) -> None:
        if select.select([self.io.fileno()], [], [], timeout)[0]:
            self.events.extend(self.io.poll())

    def wait(self, pred, timeout: float = 5.0):
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self.events):
                if pred(ev):
                    del self.events[i]
                    return ev
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no such event; have {self.events[:10]}")
            self.pump(min(left, 0.2))

    def frames_of(self, cid: int) -> list[bytes]:
        out = [bytes(e[2]) for e in self.events if e[0] == FRAME and e[1] == cid]
        self.events = [e for e in self.events if not (e[0] == FRAME and e[1] == cid)]
        return out

    def close(self) -> None:
        self.io.stop()
        for c in self.clients:
            c.close()
        self.listener.close()


@pytest.fixture
def h():
    harness = Harness()
    yield harness
    harness.close()


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def recv_exactly(sock: socket.socket, n: int, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, f"closed after {len(out)} of {n} bytes"
        out += chunk
    return bytes(out)


def test_frame_split_at_every_byte_arrives_whole_and_only_once_complete(h):
    client, cid = h.connect()
    payload = bytes(range(37))
    wire = framed(payload)
    for split in range(1, len(wire)):
        client.sendall(wire[:split])
        time.sleep(0.003)
        h.pump(0.002)
        assert not [e for e in h.events if e[0] == FRAME], f"a partial frame was delivered at split {split}"
        client.sendall(wire[split:])
        ev = h.wait(lambda e: e[0] == FRAME and e[1] == cid)
        assert bytes(ev[2]) == payload and len(ev[2]) == len(payload)


def test_large_frames_split_and_back_to_back_frames_keep_their_order(h):
    client, cid = h.connect()
    big = os.urandom(300_000)  # received straight into its own buffer
    wire = framed(big)
    for split in (1, 3, 4, 5, 40_000, len(wire) - 1):
        client.sendall(wire[:split])
        time.sleep(0.005)
        client.sendall(wire[split:])
        ev = h.wait(lambda e: e[0] == FRAME and e[1] == cid)
        assert bytes(ev[2]) == big
    payloads = [os.urandom(n) for n in (0, 1, 5, 100, 33_000, 7, 70_000, 2)]
    client.sendall(b"".join(framed(p) for p in payloads))
    deadline = time.monotonic() + 5
    got: list[bytes] = []
    while len(got) < len(payloads) and time.monotonic() < deadline:
        h.pump(0.1)
        got += h.frames_of(cid)
    assert got == payloads
    # a frame is a writable buffer the handler may patch in place
    view = memoryview(ev[2])
    assert not view.readonly
    view[0] = 0


def test_oversize_and_negative_sizes_end_reading_with_the_reason():
    h = Harness(max_frame=1024)
    try:
        for size in (1025, -1, 2**31 - 1):
            client, cid = h.connect()
            client.sendall(framed(b"x" * 10) + struct.pack(">i", size) + b"y" * 64)
            assert bytes(h.wait(lambda e: e[0] == FRAME and e[1] == cid)[2]) == b"x" * 10
            ev = h.wait(lambda e: e[0] == EOF and e[1] == cid)
            assert "max.request.bytes=1024" in ev[2]
            # answers of requests read before still go out, then the connection closes
            assert h.io.send(cid, b"answer") >= 0
            h.io.close(cid, True)
            h.wait(lambda e: e[0] == CLOSED and e[1] == cid)
            assert recv_exactly(client, 6) == b"answer"
            assert client.recv(10) == b""
        assert h.io.stats()["connections"] == 0
    finally:
        h.close()


def test_client_closing_mid_frame_frees_the_partial_frame(h):
    for partial in (b"\x00\x00", framed(b"z" * 100)[:50], framed(b"z" * 200_000)[:100_000]):
        client, cid = h.connect()
        client.sendall(partial)
        time.sleep(0.01)
        client.close()
        ev = h.wait(lambda e: e[0] == EOF and e[1] == cid)
        assert ev[2] is None
        assert not h.frames_of(cid)
        h.io.close(cid, True)
        h.wait(lambda e: e[0] == CLOSED and e[1] == cid)
    assert h.io.stats()["connections"] == 0
    assert h.io.send(cid, b"late") == -1  # a closed connection's id is never reused


def test_half_sent_answers_are_released_when_the_connection_closes(h):
    client, cid = h.connect()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    answer = bytearray(os.urandom(16 << 20))  # far more than the socket buffers take
    backlog = h.io.send(cid, [b"head", answer, memoryview(b"tail")])
    assert backlog == len(answer) + 8
    time.sleep(0.1)
    h.pump(0.01)
    assert 0 < h.io.backlog(cid) <= backlog  # the client reads nothing: most of it waits
    with pytest.raises(BufferError):
        answer.append(0)  # the thread still holds it
    h.io.close(cid, False)
    h.wait(lambda e: e[0] == CLOSED and e[1] == cid)
    h.io.poll()
    answer.append(0)  # released: the buffer may change again
    assert h.io.stats()["connections"] == 0


def test_answers_of_a_client_that_reset_are_released(h):
    client, cid = h.connect()
    answer = bytearray(8 << 20)
    h.io.send(cid, answer)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # RST
    h.wait(lambda e: e[0] == EOF and e[1] == cid)
    h.io.close(cid, True)
    h.wait(lambda e: e[0] == CLOSED and e[1] == cid)
    h.io.poll()
    answer.append(0)


def test_partial_writes_deliver_every_byte_in_order(h):
    client, cid = h.connect()
    chunks = [os.urandom(n) for n in (1, 0, 70_000, 3, 2_000_000, 12)] * 3 + [b""] * 200 + [b"end"]
    for i in range(0, 18, 4):
        h.io.send(cid, chunks[i:i + 4])
    h.io.send(cid, chunks[20:])  # more empty buffers than one writev takes
    expected = b"".join(chunks)
    assert recv_exactly(client, len(expected), timeout=20) == expected
    h.io.watch_drain(cid, 0)
    h.wait(lambda e: e[0] == DRAINED and e[1] == cid)


def test_paused_connection_is_not_read_until_resumed(h):
    client, cid = h.connect()
    h.io.pause(cid, True)
    time.sleep(0.05)
    client.sendall(framed(b"one") + framed(b"two"))
    time.sleep(0.1)
    h.pump(0.05)
    assert not h.frames_of(cid)
    h.io.pause(cid, False)
    h.wait(lambda e: e[0] == FRAME and e[1] == cid)
    h.wait(lambda e: e[0] == FRAME and e[1] == cid)


def test_many_connections_each_get_their_own_answers_in_order(h):
    clients = [h.connect() for _ in range(300)]
    for i, (client, _) in enumerate(clients):
        client.sendall(b"".join(framed(b"%d-%d" % (i, k)) for k in range(3)))
    by_cid: dict[int, list[bytes]] = {}
    deadline = time.monotonic() + 10
    while sum(len(v) for v in by_cid.values()) < 900 and time.monotonic() < deadline:
        h.pump(0.1)
        for ev in [e for e in h.events if e[0] == FRAME]:
            by_cid.setdefault(ev[1], []).append(bytes(ev[2]))
        h.events = [e for e in h.events if e[0] != FRAME]
    for i, (client, cid) in enumerate(clients):
        assert by_cid[cid] == [b"%d-%d" % (i, k) for k in range(3)]
        h.io.send(cid, [framed(f) for f in by_cid[cid]])
    for i, (client, cid) in enumerate(clients):
        assert recv_exactly(client, sum(len(framed(b"%d-%d" % (i, k))) for k in range(3))) \
            == b"".join(framed(b"%d-%d" % (i, k)) for k in range(3))
    assert h.io.stats()["connections"] == 300
    for client, cid in clients:
        client.close()
    for client, cid in clients:
        h.wait(lambda e, cid=cid: e[0] == EOF and e[1] == cid)
        h.io.close(cid)
    deadline = time.monotonic() + 5
    while h.io.stats()["connections"] and time.monotonic() < deadline:
        h.pump(0.05)
    assert h.io.stats()["connections"] == 0


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_repeated_bad_clients_do_not_grow_memory():
    h = Harness(max_frame=100_000)
    try:
        def churn(n: int) -> None:
            for i in range(n):
                client, cid = h.connect()
                bad = (framed(b"q" * 90_000)[:60_000], struct.pack(">i", 200_000) + b"x" * 10)[i % 2]
                h.io.send(cid, bytes(50_000))
                client.sendall(bad)
                client.close()
                h.wait(lambda e: e[0] == EOF and e[1] == cid)
                h.io.close(cid, False)
                h.wait(lambda e: e[0] == CLOSED and e[1] == cid)
                h.clients.remove(client)
        churn(100)
        before = _rss_bytes()
        churn(400)
        assert _rss_bytes() - before < 8 << 20
        assert h.io.stats()["connections"] == 0
    finally:
        h.close()


def test_thousands_of_round_trips_never_lose_a_wake_up(h):
    # One request, one answer, one after another: each waits on both threads' wake-ups, so
    # a wake-up lost between a drain and a flag shows here as a stall.
    client, cid = h.connect()
    client.settimeout(5)
    for i in range(3000):
        client.sendall(framed(b"%d" % i))
        ev = h.wait(lambda e: e[0] == FRAME, timeout=5)
        h.io.send(ev[1], framed(bytes(ev[2])))
        assert recv_exactly(client, 4 + len(b"%d" % i)) == framed(b"%d" % i)


def test_send_many_queues_for_several_connections_and_reports_backlogs(h):
    (a, ida), (b, idb) = h.connect(), h.connect()
    big = bytes(4 << 20)
    over = h.io.send_many([(ida, b"one"), (idb, [b"x", big]), (12345, b"nobody"), (ida, [b"two", b""])], 1 << 20)
    assert over == [idb]  # counted when queued: 4 MB not yet written
    assert recv_exactly(a, 6) == b"onetwo"
    with pytest.raises(TypeError):
        h.io.send_many([ida], 0)
    assert recv_exactly(b, len(big) + 1, timeout=20)[:1] == b"x"
    h.io.watch_drain(idb, 0)
    h.wait(lambda e: e[0] == DRAINED and e[1] == idb)
