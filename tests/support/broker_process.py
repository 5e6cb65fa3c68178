"""Runs a real `fluvial broker` process for integration tests."""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Brokers a test started and did not stop (it failed half-way): killed when the test run
# ends, so no broker outlives the run that started it.
_STARTED: set[subprocess.Popen] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_STARTED):
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class BrokerProcess:
    """A broker child process on a free port with its own data dir; restartable.

    Without a given port the first start binds port 0 and takes the port the broker reports
    as ready (no window in which another process can take a port picked beforehand);
    restarts keep that port, so clients reconnect to the same bootstrap address."""

    def __init__(self, data_dir: Path, *extra_args: str, port: int | None = None):
        self.data_dir = Path(data_dir)
        self._port = port
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None
        self.ports: dict = {}
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"

    @property
    def port(self) -> int:
        if self._port is None:
            # Asked for before the first start: pick one now (the start binds it).
            self._port = free_port()
        return self._port

    @property
    def http_url(self) -> str:
        """The schema registry's base URL."""
        return f"http://127.0.0.1:{self.ports['http_port']}"

    @property
    def flight_url(self) -> str:
        """The table API's Arrow Flight location."""
        return f"grpc://127.0.0.1:{self.ports['flight_port']}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "BrokerProcess":
        cmd = [sys.executable, "-m", "fluvial.broker", "broker", "--data-dir", str(self.data_dir),
               "--kafka-port", str(self._port or 0), "--http-port", "0", "--flight-port", "0", "--log-format", "text", *self.extra_args]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        _STARTED.add(self.proc)
        ready = threading.Event()

        def watch():
            for line in self.proc.stdout:
                try:
                    event = json.loads(line)
                    if event.get("event") == "ready":
                        self.ports = event
                        self._port = event["kafka_port"]
                        ready.set()
                except ValueError:
                    pass

        threading.Thread(target=watch, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"broker did not start (exit {self.proc.poll()}):\n{self.log_tail()}")
        return self

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        _STARTED.discard(self.proc)
        self.proc = None
        return code

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            _STARTED.discard(self.proc)
            self.proc = None

    def restart(self) -> "BrokerProcess":
        self.stop()
        return self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
