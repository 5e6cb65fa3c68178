"""gRPC's socket I/O on the calling thread: set before gRPC starts, an operator's own setting kept."""
from __future__ import annotations

import os
import subprocess
import sys

from fluvial.client import grpc_io


def test_inline_io_sets_the_experiments_when_unset(monkeypatch):
    monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)
    assert grpc_io.inline_io() is True
    assert os.environ["GRPC_EXPERIMENTS"] == grpc_io.INLINE_IO_EXPERIMENTS
    names = os.environ["GRPC_EXPERIMENTS"].split(",")
    assert "-event_engine_client" in names and "-event_engine_listener" in names


def test_inline_io_keeps_an_operators_setting(monkeypatch):
    monkeypatch.setenv("GRPC_EXPERIMENTS", "")
    assert grpc_io.inline_io() is False
    assert os.environ["GRPC_EXPERIMENTS"] == ""
    monkeypatch.setenv("GRPC_EXPERIMENTS", "-event_engine_client")
    assert grpc_io.inline_io() is False
    assert os.environ["GRPC_EXPERIMENTS"] == "-event_engine_client"


def test_a_flight_round_trip_works_with_inline_io():
    """A fresh process with the experiments off still serves and answers Flight calls
    (gRPC accepts the names: an unknown one would be logged, a refused one fail)."""
    code = """
import pyarrow as pa, pyarrow.flight as fl
from fluvial.client.grpc_io import inline_io
assert inline_io()
class Echo(fl.FlightServerBase):
    def do_exchange(self, context, descriptor, reader, writer):
        started = False
        for chunk in reader:
            if not started:
                writer.begin(chunk.data.schema); started = True
            writer.write_batch(chunk.data)
server = Echo("grpc://127.0.0.1:0")
client = fl.FlightClient(f"grpc://127.0.0.1:{server.port}")
writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(b"x"))
batch = pa.record_batch({"id": pa.array(range(1000), pa.int64())})
writer.begin(batch.schema)
for _ in range(3):
    writer.write_batch(batch)
    assert reader.read_chunk().data.equals(batch)
writer.done_writing()
writer.close()
client.close()
server.shutdown()
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert "experiment" not in out.stderr.lower(), out.stderr
