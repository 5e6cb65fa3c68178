"""Both socket I/O paths of the PLAINTEXT Kafka listener serve real clients the same way:
the compiled I/O thread (the default) and asyncio's transports (`--kafka-io asyncio`, also
the fallback when the compiled module is missing)."""
from __future__ import annotations

import socket
import struct
import time

import pytest
from confluent_kafka import Consumer, Producer

from fluvial.protocol.messages import ApiKey, decode_response, encode_request

THREAD_LINE = "Kafka listener socket I/O: compiled I/O thread"


def _round_trip(bootstrap: str, topic: str, n: int = 2000) -> list[bytes]:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 1})
    for i in range(n):
        p.produce(topic, b"v%d" % i, key=b"k%d" % (i % 7))
        if i % 200 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g-" + topic, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    return got


@pytest.mark.parametrize("mode", ["thread", "asyncio"])
def test_both_io_paths_serve_clients_and_refuse_oversize_frames(fresh_broker, mode):
    b = fresh_broker("--kafka-io", mode, "--max-request-bytes", "1000000")
    assert (THREAD_LINE in b.log_path.read_text()) == (mode == "thread")
    got = _round_trip(b.bootstrap, f"io-{mode}")
    assert got == [b"v%d" % i for i in range(2000)]
    host, port = b.bootstrap.split(":")
    # Pipelined requests on one connection are answered in order; an oversize frame after
    # them closes the connection once their answers are out.
    with socket.create_connection((host, int(port)), timeout=10) as s:
        frames = [encode_request(ApiKey.API_VERSIONS, 0, 50 + i, {}, client_id="t") for i in range(5)]
        s.sendall(b"".join(frames) + struct.pack(">i", 2_000_000) + b"x" * 100)
        f = s.makefile("rb")
        for i in range(5):
            (size,) = struct.unpack(">i", f.read(4))
            correlation, _ = decode_response(ApiKey.API_VERSIONS, 0, f.read(size))
            assert correlation == 50 + i
        assert f.read(1) == b""
    assert b.alive()
    assert "larger than max.request.bytes=1000000" in b.log_path.read_text()


def test_missing_compiled_module_falls_back_to_asyncio(monkeypatch, tmp_path):
    import asyncio

    from fluvial.broker import netio
    from fluvial.broker.broker import Broker
    from fluvial.broker.config import BrokerConfig

    monkeypatch.setattr(netio, "_netio", None)
    assert not netio.available()

    async def main() -> int:
        broker = Broker(BrokerConfig(data_dir=tmp_path / "data", kafka_port=0, http_port=0, flight_port=0,
                                     kafka_io="thread"))
        await broker.start()
        try:
            assert broker.kafka._thread_listener is None and broker.kafka._server is not None

            def api_versions() -> int:
                with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as s:
                    s.sendall(encode_request(ApiKey.API_VERSIONS, 0, 7, {}, client_id="t"))
                    f = s.makefile("rb")
                    (size,) = struct.unpack(">i", f.read(4))
                    return decode_response(ApiKey.API_VERSIONS, 0, f.read(size))[0]

            return await asyncio.to_thread(api_versions)
        finally:
            await broker.stop()

    assert asyncio.run(main()) == 7
