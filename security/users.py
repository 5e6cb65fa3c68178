"""Users and their SCRAM credentials, kept in `<data-dir>/users.json`.

Only SCRAM credentials are stored (salt, iterations, StoredKey, ServerKey per mechanism),
never a password. The whole set lives in memory: authentication (SASL on the Kafka
listener, basic auth on the HTTP and Flight listeners) reads it without I/O. A change is
written to a new file, fsynced and renamed over the old one (then the directory fsynced)
before it is visible or acknowledged, so a crash leaves either the old set or the new one.
"""
from __future__ import annotations

import asyncio
import fcntl
import hashlib
import hmac
import json
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable

from fluvial.security import scram
from fluvial.security.scram import ScramCredential

from fluvial.errors import BrokerStartError

FILE_NAME = "users.json"
_FORMAT = 1
# verify_password results remembered (per user, keyed by a keyed hash of the password) so
# that HTTP/Flight basic auth does not run PBKDF2 (thousands of HMACs) on every request.
_CACHE_SIZE = 1024


class UserStoreError(BrokerStartError):
    """The users file cannot be read."""


class UserStore:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()          # guards _users and _verified
        self._write_lock = threading.Lock()    # one writer at a time (read-modify-write of the file)
        self._users: dict[str, dict[str, ScramCredential]] = {}
        self._verified: OrderedDict[tuple[str, bytes], tuple[ScramCredential, ...]] = OrderedDict()
        # Per-process key: salts for unknown users in SCRAM, keys of the verification cache.
        self.secret = os.urandom(32)
        self._load()

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> "UserStore":
        return cls(Path(data_dir) / FILE_NAME)

    # ---- one writer process ----
    # The broker holds an exclusive lock on <data-dir>/users.lock while it runs, so that
    # `fluvial user --data-dir` (which edits the file directly) refuses to run beside it: the
    # broker would never see the edit and its next change would overwrite it.

    def hold_lock(self) -> bool:
        """Take the users file's lock (non-blocking); False when another process holds it."""
        if getattr(self, "_lock_fd", None) is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name("users.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def release_lock(self) -> None:
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock

    # ---- reading (in memory, thread-safe) ----

    def _load(self) -> None:
        try:
            doc = json.loads(self.path.read_text())
            users = {}
            for name, creds in doc.get("users", {}).items():
                users[name] = {mech: ScramCredential.from_json(mech, c) for mech, c in creds.items()}
        except FileNotFoundError:
            return
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # Guessing (starting with no users) would lock every client out or, worse, let a
            # later write drop the stored credentials: refuse to start instead.
            raise UserStoreError(f"cannot read the users in {self.path}: {exc}") from None
        self._users = users

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._users)

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return name in self._users

    def credentials(self, name: str) -> dict[str, ScramCredential]:
        """mechanism -> credential of one user (empty when unknown)."""
        with self._lock:
            return dict(self._users.get(name, {}))

    def credential(self, name: str, mechanism: str) -> ScramCredential | None:
        with self._lock:
            return self._users.get(name, {}).get(mechanism)

    def verify_password(self, name: str, password: str) -> bool:
        """True when `password` is the user's, checked against any SCRAM credential it holds."""
        with self._lock:
            creds = tuple(self._users.get(name, {}).values())
        if not creds:
            # Same work as for a known user, so that timing does not tell names apart.
            scram.check_password(scram.credential_from_salted("SCRAM-SHA-256", b"x" * 32, b"y" * 32,
                                                              scram.MIN_ITERATIONS), password)
            return False
        key = (name, hmac.new(self.secret, password.encode("utf-8"), hashlib.sha256).digest())
        with self._lock:
            hit = self._verified.get(key)
            if hit is not None:
                self._verified.move_to_end(key)
        if hit is not None and hit == creds:
            return True
        # All credentials a user holds are made from one password by `fluvial user` and the
        # bootstrap, but AlterUserScramCredentials may set them apart: any one matching counts.
        ok = any(scram.check_password(c, password) for c in creds)
        if ok:
            with self._lock:
                self._verified[key] = creds
                while len(self._verified) > _CACHE_SIZE:
                    self._verified.popitem(last=False)
        return ok

    # ---- changes (durable before visible) ----

    def _mutate(self, change: Callable[[dict[str, dict[str, ScramCredential]]], None]) -> None:
        with self._write_lock:
            with self._lock:
                users = {name: dict(creds) for name, creds in self._users.items()}
            change(users)
            users = {name: creds for name, creds in users.items() if creds}
            self._write(users)
            with self._lock:
                self._users = users
                self._verified.clear()

    def _write(self, users: dict[str, dict[str, ScramCredential]]) -> None:
        doc = {"format": _FORMAT,
               "users": {name: {mech: c.to_json() for mech, c in sorted(creds.items())}
                         for name, creds in sorted(users.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def apply(self, upserts: list[tuple[str, ScramCredential]] = (),
              deletions: list[tuple[str, str]] = ()) -> None:
        """Set credentials ((user, credential) pairs) and delete (user, mechanism) pairs in one
        durable write. Blocking: call it from a thread (see `apply_async`)."""
        def change(users):
            for user, mech in deletions:
                users.get(user, {}).pop(mech, None)
            for user, cred in upserts:
                users.setdefault(user, {})[cred.mechanism] = cred
        self._mutate(change)

    async def apply_async(self, upserts=(), deletions=(), executor=None) -> None:
        await asyncio.get_running_loop().run_in_executor(executor, self.apply, list(upserts), list(deletions))

    def set_password(self, name: str, password: str, mechanisms: tuple[str, ...] = tuple(scram.MECHANISMS),
                     iterations: int = scram.DEFAULT_ITERATIONS) -> None:
        """Give a user credentials for `password` under each mechanism (blocking)."""
        check_user_name(name)
        creds = [(name, scram.credential_from_password(m, password, iterations=iterations)) for m in mechanisms]
        self.apply(upserts=creds)

    def delete_user(self, name: str) -> bool:
        """Remove a user and all its credentials (blocking); False when there was no such user."""
        found = name in self
        if found:
            self._mutate(lambda users: users.pop(name, None))
        return found

    def bootstrap(self, users: dict[str, str]) -> None:
        """Users given at start (--user NAME=PASSWORD): created, or their password set, unless
        the password already matches (so a restart does not rewrite the file)."""
        for name, password in users.items():
            if not self.verify_password(name, password) or len(self.credentials(name)) < len(scram.MECHANISMS):
                self.set_password(name, password)


def valid_user_name(name: str) -> bool:
    return 0 < len(name) <= 255 and name.isprintable()


def check_user_name(name: str) -> None:
    if not valid_user_name(name):
        raise ValueError(f"invalid user name {name!r} (1 to 255 printable characters)")
