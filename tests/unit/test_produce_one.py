"""The one-partition produce request's own path (`produce.produce_one`) answers exactly as
the general produce path does: two real brokers (in this process, each with its own data
directory) get the same requests, one with the path and one without it, and every answer
must be the same bytes, errors and duplicates included."""
from __future__ import annotations

import asyncio
import struct
import time

import cramjam
import crc32c

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from fluvial.broker import server as server_module
from fluvial.broker.broker import Broker
from fluvial.broker.config import BrokerConfig
from fluvial.broker.handlers import Reply
from fluvial.broker.handlers.produce import produce_one
from fluvial.protocol.messages import ApiKey, decode_response, encode_request, request_class
from fluvial.protocol.records import check_produced

R = request_class(ApiKey.PRODUCE)
TS = 1_700_000_000_000


def batch(values: int = 1, producer_id: int = -1, epoch: int = -1, sequence: int = -1, codec: int = 0,
          transactional: bool = False, first: int = 0) -> bytearray:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=transactional,
                                  producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                                  batch_size=1 << 20)
    for i in range(values):
        b.append(i, timestamp=TS + first + i, key=b"k%d" % (first + i) if i % 2 else None,
                 value=b"v" * (10 + first + i), headers=[("h", b"x")] if i % 3 == 0 else [])
    return b.build()


def snappy_batch(values: int = 1, producer_id: int = -1, epoch: int = -1, sequence: int = -1) -> bytearray:
    """A batch whose records are one raw snappy block (as librdkafka and franz-go send them;
    kafka-python's snappy is snappy-java's framing)."""
    plain = batch(values, producer_id, epoch, sequence)
    out = plain[:61] + bytes(cramjam.snappy.compress_raw(bytes(plain[61:])))
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">h", out, 21, 2)  # the snappy codec
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return out


def frame(records, *, version: int = 9, topic: str = "t", index: int = 0, acks: int = -1,
          transactional_id: str | None = None, correlation_id: int = 1) -> bytes:
    body = dict(transactional_id=transactional_id, acks=acks, timeout_ms=30000,
                topic_data=[R.TopicProduceData(name=topic, partition_data=[
                    R.TopicProduceData.PartitionProduceData(index=index, records=records)])])
    return encode_request(ApiKey.PRODUCE, version, correlation_id, body, client_id="p")


class Pair:
    """Two brokers with the same tables: `fast` uses produce_one, `general` does not."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path
        self.taken = 0  # requests the fast broker answered through produce_one

    async def __aenter__(self) -> "Pair":
        # Data directories named alike: error messages naming a log's path differ only there.
        self.fast = await self._start("one")
        self.general = await self._start("two")
        return self

    async def _start(self, name: str) -> Broker:
        broker = Broker(BrokerConfig(data_dir=self.tmp_path / name, kafka_port=0, http_port=0, flight_port=0,
                                     auto_create_topics=False))
        await broker.start()
        await broker.tables.create("t", 2)
        await broker.tables.create("small", 1, {"max.message.bytes": "200"})
        await broker.tables.create("appendtime", 1, {"message.timestamp.type": "LogAppendTime"})
        await broker.tables.create("compacted", 1, {"cleanup.policy": "compact"})
        return broker

    async def __aexit__(self, *exc) -> None:
        await self.fast.stop()
        await self.general.stop()

    async def _answer(self, broker: Broker, data: bytes, fast: bool) -> bytes | None:
        def counted(*fields):
            done = produce_one(*fields)
            self.taken += done is not None
            return done

        saved = server_module.produce_one
        server_module.produce_one = counted if fast else (lambda *fields: None)
        try:
            coro = broker.kafka._dispatch(memoryview(bytearray(data))[4:], "127.0.0.1:1", time.perf_counter())
            result = await coro
        finally:
            server_module.produce_one = saved
        if isinstance(result, Reply):
            result = await result
        elif asyncio.isfuture(result):
            result = await result
        if isinstance(result, list):
            result = b"".join(bytes(c) for c in result)
        return None if result is None else bytes(result)

    async def same(self, data: bytes, broker_time: bool = False) -> bytes | None:
        """``broker_time``: the answers hold each broker's own clock (LogAppendTime), so
        they are compared field by field with that time left out."""
        taken = self.taken
        got = await self._answer(self.fast, data, True)
        expected = await self._answer(self.general, data, False)
        if got is not None:
            got = got.replace(b"/one/log/", b"/two/log/")
        if broker_time:
            assert self.taken == taken  # the broker's time is set on the general path only
            version = int.from_bytes(data[6:8], "big")
            got, expected = (_without_time(decode_response(ApiKey.PRODUCE, version, memoryview(a)[4:])[1])
                             for a in (got, expected))
        assert got == expected
        return got


def _without_time(response) -> list:
    return [(t.name, [(p.index, p.error_code, p.base_offset, p.log_start_offset, p.log_append_time_ms > 0)
                      for p in t.partition_responses]) for t in response.responses]


def run(tmp_path, steps) -> int:
    async def main() -> int:
        async with Pair(tmp_path) as pair:
            await steps(pair)
            return pair.taken
    return asyncio.run(main())


@pytest.mark.parametrize("version", [3, 7, 8, 9, 11, 12])
def test_answers_equal_the_general_path(tmp_path, version):
    async def steps(pair: Pair) -> None:
        for i in range(3):
            await pair.same(frame(batch(1 + i, first=i), version=version, correlation_id=i))
        await pair.same(frame(batch(4, codec=1), version=version, index=1))  # gzip
        assert check_produced(memoryview(snappy_batch(3))) is not None      # taken by the compiled check
        await pair.same(frame(snappy_batch(3), version=version, index=1))    # one raw snappy block
        await pair.same(frame(batch(2, codec=2), version=version, index=1))  # snappy-java's framing
        # an idempotent producer: in order, a retry (the duplicate answer), out of order, fenced
        await pair.same(frame(batch(2, 7, 0, 0), version=version))
        await pair.same(frame(batch(3, 7, 0, 2), version=version))
        await pair.same(frame(batch(2, 7, 0, 0), version=version))   # retry of the first
        await pair.same(frame(batch(1, 7, 0, 9), version=version))   # OUT_OF_ORDER_SEQUENCE_NUMBER
        await pair.same(frame(batch(1, 7, 1, 0), version=version))   # a new epoch from 0
        await pair.same(frame(batch(1, 7, 0, 5), version=version))   # an old epoch: fenced
        await pair.same(frame(batch(1), version=version, acks=1))
        await pair.same(frame(batch(1), version=version, acks=0))

    assert run(tmp_path, steps) >= 6


def test_unusual_and_refused_requests_answer_as_before(tmp_path):
    async def steps(pair: Pair) -> None:
        good = batch(2)
        corrupt = bytearray(good)
        corrupt[-1] ^= 0xFF                                           # CRC mismatch
        await pair.same(frame(corrupt))
        await pair.same(frame(batch(1), topic="missing"))            # unknown topic
        await pair.same(frame(batch(1), index=5))                    # no such partition
        await pair.same(frame(batch(1), index=-1))
        await pair.same(frame(batch(3), topic="small"))              # over max.message.bytes
        await pair.same(frame(batch(1), topic="compacted"))          # keyless record: refused
        await pair.same(frame(batch(2), topic="appendtime"), True)       # broker time: general path
        await pair.same(frame(bytes(good) + bytes(good)))            # two batches
        await pair.same(frame(bytes(good) + b"\0" * 5))              # trailing bytes
        await pair.same(frame(bytes(good) + bytes(good)[:70]))       # a second batch cut short
        await pair.same(frame(bytes(good)[:40]))                     # shorter than a header
        await pair.same(frame(b""))
        await pair.same(frame(None))                                 # null records
        await pair.same(frame(batch(1, 9, 0, 0, transactional=True), transactional_id="tx"))
        await pair.same(frame(batch(1), version=2))                  # below v3: refused
        await pair.same(frame(batch(1), acks=5))                     # INVALID_REQUIRED_ACKS
        await pair.same(frame(batch(1), transactional_id="tx"))      # an id, a plain batch
        await pair.same(frame(batch(1)))                             # and the log went on

    run(tmp_path, steps)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_batches_answer_as_before(tmp_path_factory, data):
    """Random damage to a batch (its header, CRC, records) gets the general path's answer,
    byte for byte, whichever check refuses it first; an intact one is taken as before."""
    tmp_path = tmp_path_factory.mktemp("pair")
    pid = data.draw(st.sampled_from([-1, 3]))
    codec = data.draw(st.sampled_from([0, 1, "raw snappy"]))
    values = data.draw(st.integers(1, 4))
    epoch = seq = 0 if pid >= 0 else -1
    wires = [snappy_batch(values, pid, epoch, seq) if codec == "raw snappy" else batch(values, pid, epoch, seq, codec)]
    damaged = bytearray(wires[0])
    for _ in range(data.draw(st.integers(0, 3))):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    wires.append(damaged)
    version = data.draw(st.sampled_from([3, 9, 12]))

    async def steps(pair: Pair) -> None:
        for wire in wires:
            await pair.same(frame(wire, version=version))

    run(tmp_path, steps)


def test_a_failed_fsync_is_answered_with_the_storage_error_never_an_ack(tmp_path):
    """The fsync covering a request taken by produce_one fails: its answer is
    KAFKA_STORAGE_ERROR as on the general path, and so is every later request (offline)."""
    async def steps(pair: Pair) -> None:
        await pair.same(frame(batch(1, 5, 0, 0)))  # the producer state is loaded on the general path
        taken = pair.taken
        for broker in (pair.fast, pair.general):
            segment = broker.tables.get("t").bucket(0).tablet._view.segments[-1]

            def failing_flush():
                raise OSError(5, "Input/output error")

            segment.flush = failing_flush
        refused = await pair.same(frame(batch(2, 5, 0, 1)))
        assert pair.taken == taken + 1
        response = decode_response(ApiKey.PRODUCE, 9, memoryview(refused)[4:])[1]
        assert response.responses[0].partition_responses[0].error_code == 56  # KAFKA_STORAGE_ERROR
        await pair.same(frame(batch(2, 5, 0, 1)))                  # the retry: offline, not a duplicate ack
        await pair.same(frame(batch(1)))

    run(tmp_path, steps)


def test_an_answer_that_cannot_be_made_fails_its_reply_instead_of_holding_the_connection(tmp_path, monkeypatch):
    """Encoding the acceptance of durable records raises: the reply fails (its connection is
    then closed and logged) rather than staying unfinished, which would hold back every
    later answer of the connection until the client timed out. The records stay durable."""
    from fluvial.broker.handlers import produce as produce_module

    def broken(*args):
        raise RuntimeError("cannot encode")

    async def main() -> None:
        async with Pair(tmp_path) as pair:
            monkeypatch.setattr(produce_module, "encode_accepted", broken)
            taken = pair.taken
            with pytest.raises(RuntimeError, match="cannot encode"):
                await asyncio.wait_for(pair._answer(pair.fast, frame(batch(3)), True), 10)
            assert pair.taken == taken + 1
            tablet = pair.fast.tables.get("t").bucket(0).tablet
            assert tablet.flushed_offset == tablet.log_end_offset == 3

    asyncio.run(main())
