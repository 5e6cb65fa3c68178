"""ACLs kept durable in the data directory, and the changes CreateAcls / DeleteAcls make.

The whole set is one small JSON file (`acls.json`), replaced atomically: written to a
temporary file, fsynced, renamed over the old one, and the directory fsynced. A change is
applied to the authorizer only after the file holding it is on disk, so an acknowledged
change survives kill -9 and power loss, and a failed write changes nothing. Writes run on
the broker's I/O executor, one change at a time.

ACLs are few (hundreds, not millions) and change rarely, so a full rewrite per change
costs less than a log with compaction would in code and in failure modes.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from fluvial.security.acls import AclBinding, AclBindingFilter, InvalidAclError
from fluvial.security.authorizer import Authorizer

from fluvial.errors import BrokerStartError

log = logging.getLogger(__name__)

FILE_NAME = "acls.json"
_FORMAT = 1


class AclStoreError(BrokerStartError):
    """The ACL file cannot be read (the broker refuses to start rather than guess)."""


@dataclass(slots=True)
class CreateResult:
    error: str | None = None          # None: created (or already present)
    invalid: bool = False             # True: Kafka's INVALID_REQUEST, else a storage failure


@dataclass(slots=True)
class DeleteResult:
    deleted: list[AclBinding]
    error: str | None = None
    invalid: bool = False


def load_acls(path: Path) -> list[AclBinding]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    try:
        doc = json.loads(text)
        if doc.get("format") != _FORMAT:
            raise ValueError(f"unknown format {doc.get('format')!r}")
        return [AclBinding.from_json(d) for d in doc["acls"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AclStoreError(f"cannot read the ACLs in {path}: {exc}") from None


def _write_file(path: Path, bindings: list[AclBinding]) -> None:
    doc = {"format": _FORMAT, "acls": [b.to_json() for b in bindings]}
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class AclStore:
    """The durable ACLs behind an `Authorizer` (loaded into it when opened)."""

    def __init__(self, data_dir: Path, authorizer: Authorizer, executor: Executor | None = None):
        self.path = Path(data_dir) / FILE_NAME
        self.authorizer = authorizer
        self.executor = executor
        self._lock: asyncio.Lock | None = None
        authorizer.replace(load_acls(self.path))

    async def _persist(self, bindings: frozenset[AclBinding]) -> None:
        loop = asyncio.get_running_loop()
        ordered = sorted(bindings, key=str)
        await loop.run_in_executor(self.executor, _write_file, self.path, ordered)

    def _mutex(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def create(self, bindings: list[AclBinding]) -> list[CreateResult]:
        results = []
        valid = []
        for b in bindings:
            try:
                b.validate()
            except InvalidAclError as exc:
                results.append(CreateResult(str(exc), invalid=True))
                continue
            results.append(CreateResult())
            valid.append(b)
        if not valid:
            return results
        async with self._mutex():
            current = self.authorizer.bindings
            new = current | frozenset(valid)
            if new != current:
                try:
                    await self._persist(new)
                except OSError as exc:
                    log.error("storing ACLs in %s failed: %s", self.path, exc)
                    return [r if r.invalid else CreateResult(f"storing the ACLs failed: {exc}") for r in results]
                self.authorizer.replace(new)
        for b in valid:
            log.info("ACL added: %s", b)
        return results

    async def delete(self, filters: list[AclBindingFilter]) -> list[DeleteResult]:
        async with self._mutex():
            current = self.authorizer.bindings
            results: list[DeleteResult] = []
            doomed: set[AclBinding] = set()
            for flt in filters:
                try:
                    flt.validate()
                except InvalidAclError as exc:
                    results.append(DeleteResult([], str(exc), invalid=True))
                    continue
                matched = sorted((b for b in current if flt.matches(b)), key=str)
                doomed.update(matched)
                results.append(DeleteResult(matched))
            if doomed:
                new = current - doomed
                try:
                    await self._persist(new)
                except OSError as exc:
                    log.error("storing ACLs in %s failed: %s", self.path, exc)
                    return [r if r.invalid else DeleteResult([], f"storing the ACLs failed: {exc}") for r in results]
                self.authorizer.replace(new)
                for b in sorted(doomed, key=str):
                    log.info("ACL removed: %s", b)
            return results
