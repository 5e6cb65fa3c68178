"""A real S3-compatible server process (`moto_server`) on loopback for the S3 tests.

The process keeps its objects in memory: a restart empties it (the tests that stop the store
create their bucket again after restarting it). `freeze`/`thaw` (SIGSTOP/SIGCONT) take the
store away mid-work and give it back with its objects.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

from tests.support.broker_process import free_port

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


def moto_server_command() -> str | None:
    return shutil.which("moto_server")


class MotoServer:
    """One `moto_server` child process on a fixed free port; stoppable and restartable."""

    def __init__(self, log_path: Path, port: int | None = None):
        self.port = port or free_port()
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "MotoServer":
        command = moto_server_command()
        if command is None:
            raise RuntimeError("moto_server is not installed (pip install 'moto[server]')")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([command, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.endpoint_url + "/moto-api/", timeout=1).read()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start (exit {self.proc.poll()})")
                time.sleep(0.1)

    def kill(self) -> None:
        """Stop the server abruptly (an S3 endpoint that goes away)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def freeze(self) -> None:
        """Stop the server process in its tracks (SIGSTOP): connections are accepted by the
        kernel and requests are sent, but nothing answers; the objects stay."""
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen server go on (SIGCONT): it answers what was queued meanwhile."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            self.thaw()  # a frozen process would not act on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def options(self) -> dict[str, str]:
        return {"endpoint_url": self.endpoint_url, "region": REGION,
                "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}

    def create_bucket(self, name: str | None = None) -> str:
        import boto3

        name = name or f"fluvial-{uuid.uuid4().hex[:12]}"
        client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=REGION,
                              aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        client.create_bucket(Bucket=name)
        client.close()
        return name

    def broker_args(self, bucket: str, prefix: str = "remote") -> list[str]:
        """Command-line arguments that point a broker at this server."""
        args = ["--object-store", f"s3://{bucket}/{prefix}"]
        for key, value in self.options().items():
            args += ["--object-store-option", f"{key}={value}"]
        return args
