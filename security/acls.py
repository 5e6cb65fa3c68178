"""Kafka's ACL model, with Kafka's wire codes: what a binding says and how filters select them.

An ACL binding is a resource pattern (type, name, literal or prefixed) and an entry
(principal, host, operation, allow or deny). Filters (DescribeAcls, DeleteAcls) may leave
any part open (ANY / None) and may MATCH: select every binding that would apply to a
named resource (exact literal, the '*' literal, and every prefix of the name).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
# The only name a CLUSTER resource has (Kafka's Resource.CLUSTER_NAME).
CLUSTER_NAME = "kafka-cluster"


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1      # filters only: either pattern type, names compared exactly
    MATCH = 2    # filters only: every pattern that applies to the named resource
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class InvalidAclError(ValueError):
    """A binding or filter Kafka would refuse with INVALID_REQUEST."""


def _enum(cls, value):
    """The member for a wire code; UNKNOWN for a code this broker does not know."""
    try:
        return cls(value)
    except ValueError:
        return cls.UNKNOWN


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType

    def __str__(self) -> str:
        return f"{self.resource_type.name}:{self.pattern_type.name}:{self.name}"


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    principal: str           # "User:alice" or "User:*"
    host: str                # an address, or "*"
    operation: AclOperation
    permission_type: AclPermissionType


@dataclass(frozen=True, slots=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry

    @classmethod
    def of(cls, resource_type: ResourceType, name: str, pattern_type: PatternType, principal: str, host: str,
           operation: AclOperation, permission_type: AclPermissionType) -> "AclBinding":
        return cls(ResourcePattern(_enum(ResourceType, resource_type), name,
                                   _enum(PatternType, pattern_type)),
                   AccessControlEntry(principal, host, _enum(AclOperation, operation),
                                      _enum(AclPermissionType, permission_type)))

    def validate(self) -> None:
        """Raise InvalidAclError for what Kafka refuses to store (its CreateAcls checks)."""
        p, e = self.pattern, self.entry
        if p.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            raise InvalidAclError(f"Invalid resourceType {p.resource_type.name}")
        if p.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAclError(f"Invalid patternType {p.pattern_type.name}")
        if e.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
            raise InvalidAclError(f"Invalid operation {e.operation.name}")
        if e.permission_type not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
            raise InvalidAclError(f"Invalid permissionType {e.permission_type.name}")
        if not p.name:
            raise InvalidAclError("Resource name should not be empty")
        if p.resource_type == ResourceType.CLUSTER and p.name != CLUSTER_NAME:
            raise InvalidAclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        kind, sep, name = (e.principal or "").partition(":")
        if not sep or not kind or not name:
            raise InvalidAclError(f"Could not parse principal from `{e.principal}` (no colon is present "
                                  "separating the principal type from the principal name)")
        if not e.host:
            raise InvalidAclError("Host should not be empty (use * for any host)")

    def to_json(self) -> dict:
        p, e = self.pattern, self.entry
        return {"resource_type": p.resource_type.name, "name": p.name, "pattern_type": p.pattern_type.name,
                "principal": e.principal, "host": e.host, "operation": e.operation.name,
                "permission_type": e.permission_type.name}

    @classmethod
    def from_json(cls, d: dict) -> "AclBinding":
        return cls(ResourcePattern(ResourceType[d["resource_type"]], d["name"], PatternType[d["pattern_type"]]),
                   AccessControlEntry(d["principal"], d["host"], AclOperation[d["operation"]],
                                      AclPermissionType[d["permission_type"]]))

    def __str__(self) -> str:
        e = self.entry
        return (f"{self.pattern} {e.permission_type.name} {e.principal} {e.operation.name} from host {e.host}")


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Selects bindings: None / ANY leave a part open; PatternType.MATCH selects the patterns
    that apply to the named resource."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    @classmethod
    def of(cls, resource_type: int, name: str | None, pattern_type: int, principal: str | None, host: str | None,
           operation: int, permission_type: int) -> "AclBindingFilter":
        return cls(_enum(ResourceType, resource_type), name, _enum(PatternType, pattern_type), principal,
                   host, _enum(AclOperation, operation), _enum(AclPermissionType, permission_type))

    def validate(self) -> None:
        """Kafka refuses a filter with an unknown part (INVALID_REQUEST)."""
        for value, what in ((self.resource_type, "resourceType"), (self.pattern_type, "patternType"),
                            (self.operation, "operation"), (self.permission_type, "permissionType")):
            if value == 0:
                raise InvalidAclError(f"Unknown {what} in ACL filter")

    def matches(self, binding: AclBinding) -> bool:
        p, e = binding.pattern, binding.entry
        if self.resource_type != ResourceType.ANY and self.resource_type != p.resource_type:
            return False
        pt = self.pattern_type
        if pt not in (PatternType.ANY, PatternType.MATCH) and pt != p.pattern_type:
            return False
        if self.name is not None:
            if pt == PatternType.MATCH:
                if p.pattern_type == PatternType.LITERAL:
                    if p.name != self.name and p.name != WILDCARD:
                        return False
                elif not self.name.startswith(p.name):
                    return False
            elif self.name != p.name:
                return False
        if self.principal is not None and self.principal != e.principal:
            return False
        if self.host is not None and self.host != e.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != e.operation:
            return False
        if self.permission_type != AclPermissionType.ANY and self.permission_type != e.permission_type:
            return False
        return True


ANY_FILTER = AclBindingFilter()
