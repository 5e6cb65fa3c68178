"""The authorizer's rules, as Kafka's StandardAuthorizer applies them."""
from __future__ import annotations

import threading

import pytest

from fluvial.security.acls import (AclBinding, AclBindingFilter, AclOperation as Op, AclPermissionType as Perm,
                                   InvalidAclError, PatternType as PT, ResourceType as RT)
from fluvial.security.authorizer import Authorizer, host_of
from fluvial.security.config import SecurityConfig
from fluvial.security.principal import Principal

ALICE = Principal.user("alice")
BOB = Principal.user("bob")
H = "10.0.0.1"


def acl(rt=RT.TOPIC, name="orders", pt=PT.LITERAL, principal="User:alice", host="*", op=Op.READ,
        perm=Perm.ALLOW) -> AclBinding:
    return AclBinding.of(rt, name, pt, principal, host, op, perm)


def authz(*bindings, **cfg) -> Authorizer:
    return Authorizer(SecurityConfig(authorizer=True, **cfg), bindings)


def test_off_allows_everything():
    a = Authorizer(SecurityConfig(authorizer=False), [acl(perm=Perm.DENY, op=Op.ALL, principal="User:*")])
    assert a.authorize(ALICE, H, Op.WRITE, RT.TOPIC, "orders")
    assert a.authorize_any(ALICE, H, Op.WRITE, RT.TOPIC)


def test_no_acl_denies_unless_allow_everyone():
    assert not authz().authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")
    assert authz(allow_everyone_if_no_acl_found=True).authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")
    # A resource that has ACLs (for someone else) is not "no ACL found".
    a = authz(acl(principal="User:bob"), allow_everyone_if_no_acl_found=True)
    assert not a.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")
    assert a.authorize(BOB, H, Op.READ, RT.TOPIC, "orders")
    assert a.authorize(ALICE, H, Op.READ, RT.TOPIC, "other")


def test_literal_allow_is_exact():
    a = authz(acl())
    assert a.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")
    assert not a.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders2")
    assert not a.authorize(ALICE, H, Op.WRITE, RT.TOPIC, "orders")
    assert not a.authorize(BOB, H, Op.READ, RT.TOPIC, "orders")
    assert not a.authorize(ALICE, H, Op.READ, RT.GROUP, "orders")


def test_deny_beats_allow():
    a = authz(acl(op=Op.ALL), acl(perm=Perm.DENY, op=Op.WRITE))
    assert a.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")
    assert not a.authorize(ALICE, H, Op.WRITE, RT.TOPIC, "orders")
    # A deny on the wildcard principal, or by a prefix, beats a literal allow too.
    b = authz(acl(op=Op.READ), acl(name="ord", pt=PT.PREFIXED, principal="User:*", perm=Perm.DENY, op=Op.READ))
    assert not b.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")


def test_prefixed_patterns():
    a = authz(acl(name="sales.", pt=PT.PREFIXED, op=Op.WRITE))
    assert a.authorize(ALICE, H, Op.WRITE, RT.TOPIC, "sales.orders")
    assert a.authorize(ALICE, H, Op.WRITE, RT.TOPIC, "sales.")
    assert not a.authorize(ALICE, H, Op.WRITE, RT.TOPIC, "sales")
    assert not a.authorize(ALICE, H, Op.WRITE, RT.TOPIC, "hr.orders")
    # Many prefixes (the other lookup direction).
    many = [acl(name=f"p{i}.", pt=PT.PREFIXED) for i in range(50)]
    b = authz(*many)
    assert b.authorize(ALICE, H, Op.READ, RT.TOPIC, "p7.x")
    assert not b.authorize(ALICE, H, Op.READ, RT.TOPIC, "q7.x")


def test_wildcards():
    a = authz(acl(name="*", principal="User:*", op=Op.DESCRIBE))
    assert a.authorize(BOB, H, Op.DESCRIBE, RT.TOPIC, "anything")
    assert not a.authorize(BOB, H, Op.READ, RT.TOPIC, "anything")
    # A literal '*' name only matches as the wildcard, not as a prefix.
    b = authz(acl(name="*", pt=PT.PREFIXED))
    assert not b.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")


def test_host():
    a = authz(acl(host="10.0.0.1"))
    assert a.authorize(ALICE, "10.0.0.1", Op.READ, RT.TOPIC, "orders")
    assert not a.authorize(ALICE, "10.0.0.2", Op.READ, RT.TOPIC, "orders")
    b = authz(acl(op=Op.ALL), acl(perm=Perm.DENY, host="10.0.0.2"))
    assert b.authorize(ALICE, "10.0.0.1", Op.READ, RT.TOPIC, "orders")
    assert not b.authorize(ALICE, "10.0.0.2", Op.READ, RT.TOPIC, "orders")
    assert host_of("127.0.0.1:5555") == "127.0.0.1"
    assert host_of("::1:5555") == "::1"


@pytest.mark.parametrize("granted", [Op.READ, Op.WRITE, Op.DELETE, Op.ALTER])
def test_describe_is_implied(granted):
    a = authz(acl(op=granted))
    assert a.authorize(ALICE, H, Op.DESCRIBE, RT.TOPIC, "orders")
    assert not a.authorize(ALICE, H, Op.DESCRIBE_CONFIGS, RT.TOPIC, "orders")


def test_describe_configs_implied_by_alter_configs_and_deny_implies_nothing():
    a = authz(acl(op=Op.ALTER_CONFIGS))
    assert a.authorize(ALICE, H, Op.DESCRIBE_CONFIGS, RT.TOPIC, "orders")
    assert not a.authorize(ALICE, H, Op.DESCRIBE, RT.TOPIC, "orders")
    # A DENY of READ does not deny DESCRIBE.
    b = authz(acl(op=Op.DESCRIBE), acl(op=Op.READ, perm=Perm.DENY))
    assert b.authorize(ALICE, H, Op.DESCRIBE, RT.TOPIC, "orders")
    assert not b.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")
    # A DENY of ALL denies everything.
    c = authz(acl(op=Op.ALL), acl(op=Op.ALL, perm=Perm.DENY, principal="User:*"))
    assert not c.authorize(ALICE, H, Op.DESCRIBE, RT.TOPIC, "orders")


def test_super_users_bypass_acls():
    a = authz(acl(op=Op.ALL, perm=Perm.DENY, principal="User:*"), super_users=("User:admin",))
    assert a.authorize(Principal.user("admin"), H, Op.ALTER, RT.CLUSTER, "kafka-cluster")
    assert a.authorize(Principal.user("admin"), H, Op.READ, RT.TOPIC, "orders")
    assert not a.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")


def test_authorize_any_resource_of_a_type():
    assert not authz().authorize_any(ALICE, H, Op.WRITE, RT.TOPIC)
    assert authz(acl(op=Op.WRITE)).authorize_any(ALICE, H, Op.WRITE, RT.TOPIC)
    # Denied on the allowed literal, or by a prefix covering the allowed prefix: nothing left.
    assert not authz(acl(op=Op.WRITE), acl(op=Op.WRITE, perm=Perm.DENY)).authorize_any(ALICE, H, Op.WRITE, RT.TOPIC)
    assert not authz(acl(name="ab", pt=PT.PREFIXED, op=Op.WRITE),
                     acl(name="a", pt=PT.PREFIXED, op=Op.WRITE, perm=Perm.DENY)).authorize_any(ALICE, H, Op.WRITE, RT.TOPIC)
    assert not authz(acl(op=Op.WRITE), acl(name="*", op=Op.WRITE, perm=Perm.DENY)).authorize_any(ALICE, H, Op.WRITE,
                                                                                                 RT.TOPIC)
    assert authz(acl(name="*", principal="User:*", op=Op.ALL)).authorize_any(BOB, H, Op.WRITE, RT.TOPIC)


def test_changes_invalidate_cached_decisions():
    a = authz()
    assert not a.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")
    a.add([acl()])
    assert a.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")
    a.add([acl(perm=Perm.DENY)])
    assert not a.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")
    a.remove([acl(perm=Perm.DENY)])
    assert a.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")


def test_concurrent_changes_and_checks():
    a = authz()
    stop = threading.Event()
    errors = []

    def check():
        while not stop.is_set():
            try:
                a.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

    threads = [threading.Thread(target=check) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(300):
        a.add([acl(name=f"t{i}")])
    a.add([acl()])
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert a.authorize(ALICE, H, Op.READ, RT.TOPIC, "orders")


def test_filters():
    bs = [acl(), acl(name="sales.", pt=PT.PREFIXED), acl(name="*"), acl(rt=RT.GROUP, name="g")]
    a = authz(*bs)
    assert len(a.acls(AclBindingFilter())) == 4
    assert a.acls(AclBindingFilter(resource_type=RT.GROUP)) == [bs[3]]
    match = AclBindingFilter(resource_type=RT.TOPIC, name="sales.q", pattern_type=PT.MATCH)
    assert set(a.acls(match)) == {bs[1], bs[2]}
    assert a.acls(AclBindingFilter(name="sales.", pattern_type=PT.ANY)) == [bs[1]]
    assert a.acls(AclBindingFilter(principal="User:bob")) == []
    with pytest.raises(InvalidAclError):
        AclBindingFilter.of(99, None, 1, None, None, 1, 1).validate()


@pytest.mark.parametrize("binding", [
    acl(rt=RT.ANY), acl(pt=PT.MATCH), acl(op=Op.ANY), acl(perm=Perm.ANY), acl(name=""),
    acl(rt=RT.CLUSTER, name="other"), acl(principal="alice"),
])
def test_invalid_bindings(binding):
    with pytest.raises(InvalidAclError):
        binding.validate()
