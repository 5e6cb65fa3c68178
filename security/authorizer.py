"""Decides whether a principal may perform an operation on a resource, by Kafka's rules.

The rules are those of Kafka's StandardAuthorizer:
- super users may do everything;
- the ACLs that apply to a resource are its literal name, the literal '*' and every
  prefixed pattern the name starts with; an ACL applies to a client when its principal is
  the client's or 'User:*', and its host is the client's address or '*';
- a DENY that applies wins over any ALLOW; a DENY matches its own operation or ALL only;
- an ALLOW matches its operation, ALL, and the operations it implies: READ, WRITE, DELETE
  and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS;
- a resource with no ACL at all is allowed only with allow.everyone.if.no.acl.found.

Decisions are cached per (principal, host, operation, resource): the produce path asks once
per topic per request and must not walk ACLs each time. The ACLs and the cache are one
immutable snapshot replaced as a whole on every change, so readers need no lock and never
see a decision made under the ACLs before a change.
"""
from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass, field
from typing import Iterable

from fluvial.security.acls import (WILDCARD, WILDCARD_PRINCIPAL, AclBinding, AclBindingFilter, AclOperation,
                                   AclPermissionType, PatternType, ResourceType)
from fluvial.security.config import SecurityConfig
from fluvial.security.principal import Principal

log = logging.getLogger(__name__)

_IMPLIES_DESCRIBE = frozenset({AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE,
                               AclOperation.ALTER})
_IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})
# Decisions kept before the cache starts over (a client cycling through many topic names
# must not grow it without bound).
CACHE_LIMIT = 100_000

_ALLOW = AclPermissionType.ALLOW
_DENY = AclPermissionType.DENY


@dataclass(slots=True)
class _TypeIndex:
    """The ACLs of one resource type, by literal name and by prefix."""
    literal: dict[str, list[AclBinding]] = field(default_factory=dict)
    prefixed: dict[str, list[AclBinding]] = field(default_factory=dict)


@dataclass(slots=True)
class _Snapshot:
    bindings: frozenset[AclBinding]
    index: dict[ResourceType, _TypeIndex]
    cache: dict = field(default_factory=dict)


def _index(bindings: Iterable[AclBinding]) -> dict[ResourceType, _TypeIndex]:
    index: dict[ResourceType, _TypeIndex] = {}
    for b in bindings:
        ti = index.setdefault(b.pattern.resource_type, _TypeIndex())
        by = ti.literal if b.pattern.pattern_type == PatternType.LITERAL else ti.prefixed
        by.setdefault(b.pattern.name, []).append(b)
    return index


def _applies(acl: AclBinding, principal: str, host: str, op: AclOperation) -> AclPermissionType | None:
    """ALLOW or DENY when this ACL decides for (principal, host, op); None when it says nothing."""
    e = acl.entry
    if e.principal != principal and e.principal != WILDCARD_PRINCIPAL:
        return None
    if e.host != WILDCARD and e.host != host:
        return None
    if e.operation != AclOperation.ALL and e.operation != op:
        if e.permission_type != _ALLOW:
            return None
        if op == AclOperation.DESCRIBE:
            if e.operation not in _IMPLIES_DESCRIBE:
                return None
        elif op == AclOperation.DESCRIBE_CONFIGS:
            if e.operation not in _IMPLIES_DESCRIBE_CONFIGS:
                return None
        else:
            return None
    return e.permission_type


@functools.lru_cache(maxsize=4096)
def host_of(peer: str) -> str:
    """The address part of a peer written 'host:port' (IPv6 addresses contain colons too)."""
    host, sep, _port = peer.rpartition(":")
    return host.strip("[]") if sep else peer


class Authorizer:
    """In-memory ACLs and the decisions made from them; thread-safe.

    `enabled` is False when the broker runs without an authorizer: every check then answers
    True, and callers on hot paths test the attribute before anything else.
    """

    def __init__(self, config: SecurityConfig | None = None, bindings: Iterable[AclBinding] = ()):
        config = config or SecurityConfig()
        self.enabled: bool = bool(config.authorizer)
        self.super_users: frozenset[str] = frozenset(config.super_users)
        self.allow_if_no_acl: bool = bool(config.allow_everyone_if_no_acl_found)
        self._write_lock = threading.Lock()
        bs = frozenset(bindings)
        self._snap = _Snapshot(bs, _index(bs))

    # ---- decisions ----

    def authorize(self, principal: Principal | str, host: str, operation: AclOperation,
                  resource_type: ResourceType, name: str) -> bool:
        if not self.enabled:
            return True
        snap = self._snap
        # Keyed by the principal's strings, whose hashes Python caches: hashing the
        # Principal dataclass itself would cost more than the rest of the check.
        if type(principal) is Principal:
            key = (principal.type, principal.name, host, operation, resource_type, name)
        else:
            key = (principal, host, operation, resource_type, name)
        hit = snap.cache.get(key)
        if hit is not None:
            return hit
        result = self._decide(snap, str(principal), host, operation, resource_type, name)
        if not result:
            # Once per decision (later checks hit the cache), as Kafka's authorizer log does.
            log.debug("denied: %s from %s may not %s %s %r", principal, host, getattr(operation, "name", operation),
                      getattr(resource_type, "name", resource_type), name)
        if len(snap.cache) >= CACHE_LIMIT:
            snap.cache.clear()
        snap.cache[key] = result
        return result

    def _decide(self, snap: _Snapshot, principal: str, host: str, op: AclOperation, rtype: ResourceType,
                name: str) -> bool:
        if principal in self.super_users:
            return True
        ti = snap.index.get(rtype)
        if ti is None:
            return self.allow_if_no_acl
        candidates: list[AclBinding] = []
        candidates.extend(ti.literal.get(name, ()))
        candidates.extend(ti.literal.get(WILDCARD, ()) if name != WILDCARD else ())
        if ti.prefixed:
            prefixed = ti.prefixed
            if len(prefixed) < len(name):
                for prefix, acls in prefixed.items():
                    if name.startswith(prefix):
                        candidates.extend(acls)
            else:
                for i in range(1, len(name) + 1):
                    acls = prefixed.get(name[:i])
                    if acls:
                        candidates.extend(acls)
        if not candidates:
            return self.allow_if_no_acl
        allowed = False
        for acl in candidates:
            verdict = _applies(acl, principal, host, op)
            if verdict == _DENY:
                return False
            if verdict == _ALLOW:
                allowed = True
        return allowed

    def authorize_any(self, principal: Principal | str, host: str, operation: AclOperation,
                      resource_type: ResourceType) -> bool:
        """Whether the principal may perform `operation` on at least one resource of the type
        (Kafka's authorizeByResourceType, e.g. InitProducerId's 'WRITE on any topic')."""
        if not self.enabled:
            return True
        snap = self._snap
        key = ("any", str(principal), host, operation, resource_type)
        hit = snap.cache.get(key)
        if hit is None:
            hit = self._decide_any(snap, str(principal), host, operation, resource_type)
            snap.cache[key] = hit
        return hit

    def _decide_any(self, snap: _Snapshot, principal: str, host: str, op: AclOperation, rtype: ResourceType) -> bool:
        # As Kafka: first as if for a resource no ACL names (super users, allow-if-no-ACL).
        if self._decide(snap, principal, host, op, rtype, "hardcode"):
            return True
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow: list[tuple[PatternType, str]] = []
        for b in snap.bindings:
            e = b.entry
            if b.pattern.resource_type != rtype:
                continue
            if e.host != WILDCARD and e.host != host:
                continue
            if e.principal != principal and e.principal != WILDCARD_PRINCIPAL:
                continue
            if e.operation != op and e.operation != AclOperation.ALL:
                continue
            if e.permission_type == _DENY:
                if b.pattern.pattern_type == PatternType.LITERAL:
                    if b.pattern.name == WILDCARD:
                        return False
                    deny_literal.add(b.pattern.name)
                else:
                    deny_prefixed.add(b.pattern.name)
            elif e.permission_type == _ALLOW:
                if b.pattern.pattern_type == PatternType.LITERAL and b.pattern.name == WILDCARD:
                    return True
                allow.append((b.pattern.pattern_type, b.pattern.name))
        for pattern_type, name in allow:
            if pattern_type == PatternType.LITERAL and name in deny_literal:
                continue
            if any(name[:i] in deny_prefixed for i in range(1, len(name) + 1)):
                continue
            return True
        return False

    def authorized_operations(self, principal: Principal | str, host: str, resource_type: ResourceType, name: str,
                              supported: Iterable[int]) -> set[int]:
        """The supported operations (codes) the principal may perform on the resource."""
        return {op for op in supported if self.authorize(principal, host, AclOperation(op), resource_type, name)}

    # ---- the ACLs ----

    def acls(self, flt: AclBindingFilter | None = None) -> list[AclBinding]:
        bindings = self._snap.bindings
        return sorted((b for b in bindings if flt is None or flt.matches(b)), key=str)

    @property
    def bindings(self) -> frozenset[AclBinding]:
        return self._snap.bindings

    def replace(self, bindings: Iterable[AclBinding]) -> None:
        """Install a new set of ACLs; every cached decision goes with the old set."""
        bs = frozenset(bindings)
        with self._write_lock:
            self._snap = _Snapshot(bs, _index(bs))

    def add(self, bindings: Iterable[AclBinding]) -> None:
        with self._write_lock:
            bs = self._snap.bindings | frozenset(bindings)
            self._snap = _Snapshot(bs, _index(bs))

    def remove(self, bindings: Iterable[AclBinding]) -> None:
        with self._write_lock:
            bs = self._snap.bindings - frozenset(bindings)
            self._snap = _Snapshot(bs, _index(bs))
