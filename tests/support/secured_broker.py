"""A broker with security settings in a child process, with a control channel on its stdin so
that a test can set users' passwords and ACLs through the broker's own user store and
authorizer (as an administrator would with `fluvial user` / CreateAcls)."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from dataclasses import asdict, replace
from pathlib import Path

from fluvial.security.acls import AclOperation, PatternType, ResourceType
from fluvial.security.config import SecurityConfig
from tests.support import broker_process


class SecuredBroker:
    """Start with `start()`, stop with `stop()`; `users` are created (SCRAM credentials) first."""

    def __init__(self, data_dir: Path, security: SecurityConfig, users: dict[str, str]):
        self.data_dir = Path(data_dir)
        self.security = security
        self.user_passwords = dict(users)
        self.proc: subprocess.Popen | None = None
        self.ports: dict = {}
        self._lock = threading.Lock()

    def start(self, timeout: float = 60.0) -> "SecuredBroker":
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.security).items()}
        spec = json.dumps({"data_dir": str(self.data_dir), "security": settings, "users": self.user_passwords})
        log = open(self.data_dir.parent / f"{self.data_dir.name}-broker.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.secured_broker", spec],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                     cwd=str(Path(__file__).resolve().parents[2]),
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        broker_process._STARTED.add(self.proc)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the broker did not start (see {log.name})")
        self.ports = json.loads(line)
        return self

    def _command(self, **command) -> None:
        with self._lock:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
            answer = json.loads(self.proc.stdout.readline())
        if answer.get("error"):
            raise RuntimeError(answer["error"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(60)

    @property
    def http_url(self) -> str:
        scheme = "https" if self.security.http_tls else "http"
        return f"{scheme}://localhost:{self.ports['http_port']}"

    @property
    def flight_url(self) -> str:
        scheme = "grpc+tls" if self.security.flight_tls else "grpc"
        return f"{scheme}://localhost:{self.ports['flight_port']}"

    def allow(self, user: str, operation: AclOperation, name: str, resource_type: ResourceType = ResourceType.TOPIC,
              pattern: PatternType = PatternType.LITERAL) -> None:
        self._command(op="allow", user=user, operation=int(operation), name=name, resource_type=int(resource_type),
                      pattern=int(pattern))

    def clear_acls(self) -> None:
        self._command(op="clear")

    def delete_user(self, user: str) -> None:
        self._command(op="delete_user", user=user)


def tls_security(pki, **settings) -> SecurityConfig:
    """Security settings with the test PKI's server certificate, plus `settings`."""
    return replace(SecurityConfig(ssl_certfile=pki.server.cert, ssl_keyfile=pki.server.key), **settings)


# ---- the child process ----------------------------------------------------------------------

async def _serve(spec: dict) -> None:
    from fluvial.broker.broker import Broker
    from fluvial.broker.config import BrokerConfig
    from fluvial.security.acls import AclBinding, AclPermissionType

    security = SecurityConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in spec["security"].items()})
    for key in ("ssl_certfile", "ssl_keyfile", "ssl_cafile"):
        if getattr(security, key):
            setattr(security, key, Path(getattr(security, key)))
    config = BrokerConfig(data_dir=Path(spec["data_dir"]), host="127.0.0.1", kafka_port=0, http_port=0,
                          flight_port=0, security=security)
    broker = Broker(config)
    for name, password in spec["users"].items():
        broker.users.set_password(name, password)
    await broker.start()
    print(json.dumps({"kafka_port": broker.kafka_port, **broker.ports}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        command = json.loads(line)
        try:
            if command["op"] == "allow":
                broker.authorizer.add([AclBinding.of(command["resource_type"], command["name"], command["pattern"],
                                                     f"User:{command['user']}", "*", command["operation"],
                                                     AclPermissionType.ALLOW)])
            elif command["op"] == "clear":
                broker.authorizer.replace([])
            elif command["op"] == "delete_user":
                broker.users.delete_user(command["user"])
            print(json.dumps({"ok": True}), flush=True)
        except Exception as exc:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
    await broker.stop()


if __name__ == "__main__":
    asyncio.run(_serve(json.loads(sys.argv[1])))
