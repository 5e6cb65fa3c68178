"""The durable ACL file: changes reach the authorizer only once on disk; bad files stop the start."""
from __future__ import annotations

import asyncio
import json

import pytest

from fluvial.security.acl_store import AclStore, AclStoreError
from fluvial.security.acls import (AclBinding, AclBindingFilter, AclOperation as Op, AclPermissionType as Perm,
                                   PatternType as PT, ResourceType as RT)
from fluvial.security.authorizer import Authorizer
from fluvial.security.config import SecurityConfig
from fluvial.security.principal import Principal


def binding(name="orders", op=Op.READ) -> AclBinding:
    return AclBinding.of(RT.TOPIC, name, PT.LITERAL, "User:alice", "*", op, Perm.ALLOW)


def authz() -> Authorizer:
    return Authorizer(SecurityConfig(authorizer=True))


def test_create_delete_and_reload(tmp_path):
    a = authz()
    store = AclStore(tmp_path, a)
    results = asyncio.run(store.create([binding(), binding("x", Op.UNKNOWN)]))
    assert [r.error is None for r in results] == [True, False] and results[1].invalid
    assert a.authorize(Principal.user("alice"), "h", Op.READ, RT.TOPIC, "orders")
    b = authz()
    AclStore(tmp_path, b)                                   # a restart reads the file
    assert b.bindings == {binding()}
    deleted = asyncio.run(store.delete([AclBindingFilter(resource_type=RT.TOPIC), AclBindingFilter.of(0, None, 1,
                                                                                                        None, None,
                                                                                                        1, 1)]))
    assert deleted[0].deleted == [binding()] and deleted[1].invalid
    assert not a.authorize(Principal.user("alice"), "h", Op.READ, RT.TOPIC, "orders")
    c = authz()
    AclStore(tmp_path, c)
    assert c.bindings == frozenset()


def test_a_failed_write_changes_nothing(tmp_path):
    a = authz()
    store = AclStore(tmp_path, a)
    asyncio.run(store.create([binding()]))
    (tmp_path / "acls.json.tmp").mkdir()                    # the next write cannot create its file
    results = asyncio.run(store.create([binding("other")]))
    assert results[0].error is not None and not results[0].invalid
    assert a.bindings == {binding()}
    deleted = asyncio.run(store.delete([AclBindingFilter()]))
    assert deleted[0].error is not None and a.bindings == {binding()}
    b = authz()
    AclStore(tmp_path, b)
    assert b.bindings == {binding()}


@pytest.mark.parametrize("text", ["{", json.dumps({"format": 9, "acls": []}),
                                  json.dumps({"format": 1, "acls": [{"resource_type": "NOPE"}]})])
def test_an_unreadable_file_stops_the_start(tmp_path, text):
    (tmp_path / "acls.json").write_text(text)
    with pytest.raises(AclStoreError):
        AclStore(tmp_path, authz())
