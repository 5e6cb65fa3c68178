"""CreateAcls / DescribeAcls / DeleteAcls through confluent-kafka's AdminClient; ACLs survive kill -9."""
from __future__ import annotations

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType)

from tests.support.kafka_wire import call

pytestmark = pytest.mark.timeout(120)

T = 15


def admin(broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def binding(name="orders", pattern=ResourcePatternType.LITERAL, principal="User:alice", op=AclOperation.READ,
            perm=AclPermissionType.ALLOW, rtype=ResourceType.TOPIC, host="*") -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def everything(rtype=ResourceType.ANY) -> AclBindingFilter:
    return AclBindingFilter(rtype, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                            AclPermissionType.ANY)


def create(a: AdminClient, bindings: list[AclBinding]) -> None:
    for fut in a.create_acls(bindings, request_timeout=T).values():
        fut.result()


def key(b: AclBinding) -> tuple:
    return (b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type)


def test_create_describe_delete_and_survive_kill9(fresh_broker):
    b = fresh_broker("--authorizer-enabled", "true", "--super-users", "User:ANONYMOUS")
    a = admin(b)
    wanted = [binding(), binding(name="sales.", pattern=ResourcePatternType.PREFIXED, op=AclOperation.WRITE),
              binding(name="*", principal="User:*", op=AclOperation.DESCRIBE),
              binding(rtype=ResourceType.GROUP, name="g1", perm=AclPermissionType.DENY, host="10.1.2.3")]
    create(a, wanted)
    got = a.describe_acls(everything(), request_timeout=T).result()
    assert sorted(map(key, got)) == sorted(map(key, wanted))
    # MATCH: the ACLs that apply to one topic name.
    match = AclBindingFilter(ResourceType.TOPIC, "sales.q1", ResourcePatternType.MATCH, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    assert sorted(map(key, a.describe_acls(match, request_timeout=T).result())) == sorted(map(key, wanted[1:3]))

    # Acknowledged changes are on disk: kill -9 and start again.
    b.kill9()
    b.start()
    a = admin(b)
    assert sorted(map(key, a.describe_acls(everything(), request_timeout=T).result())) == sorted(map(key, wanted))

    # Delete the group ACL by filter; the deleted bindings come back.
    flt = everything(ResourceType.GROUP)
    deleted = a.delete_acls([flt], request_timeout=T)[flt].result()
    assert list(map(key, deleted)) == [key(wanted[3])]
    b.kill9()
    b.start()
    a = admin(b)
    assert sorted(map(key, a.describe_acls(everything(), request_timeout=T).result())) == sorted(map(key, wanted[:3]))
    # A filter matching nothing deletes nothing.
    none = AclBindingFilter(ResourceType.TOPIC, "nope", ResourcePatternType.LITERAL, None, None, AclOperation.ANY,
                            AclPermissionType.ANY)
    assert a.delete_acls([none], request_timeout=T)[none].result() == []


def test_invalid_acls_are_refused_with_invalid_request(fresh_broker):
    b = fresh_broker("--authorizer-enabled", "true", "--super-users", "User:ANONYMOUS")
    a = admin(b)
    bad = binding(rtype=ResourceType.BROKER, name="other")  # CLUSTER resource: only 'kafka-cluster'
    good = binding()
    futs = a.create_acls([bad, good], request_timeout=T)
    with pytest.raises(KafkaException) as err:
        futs[bad].result()
    assert err.value.args[0].name() == "INVALID_REQUEST"
    futs[good].result()
    assert [key(x) for x in a.describe_acls(everything(), request_timeout=T).result()] == [key(good)]


def test_without_authorizer_the_acl_apis_answer_security_disabled(broker):
    a = admin(broker)
    # librdkafka drops DescribeAcls' top-level error (an empty list comes back): checked on the wire.
    answer = call(broker.bootstrap, 29, 3, dict(resource_type_filter=1, resource_name_filter=None,
                                                pattern_type_filter=1, principal_filter=None, host_filter=None,
                                                operation=1, permission_type=1))
    assert answer.error_code == 54 and answer.resources == []  # SECURITY_DISABLED
    with pytest.raises(KafkaException) as err:
        create(a, [binding()])
    assert err.value.args[0].name() == "SECURITY_DISABLED"


def test_acl_apis_need_alter_and_describe_on_the_cluster(fresh_broker):
    # ANONYMOUS is no super user here: it may only DESCRIBE the cluster (an ACL set by hand
    # in the data directory before the broker starts, as an operator restoring a backup would).
    import json
    b = fresh_broker("--authorizer-enabled", "true")
    b.stop()
    (b.data_dir / "acls.json").write_text(json.dumps({"format": 1, "acls": [
        {"resource_type": "CLUSTER", "name": "kafka-cluster", "pattern_type": "LITERAL", "principal": "User:*",
         "host": "*", "operation": "DESCRIBE", "permission_type": "ALLOW"}]}))
    b.start()
    a = admin(b)
    assert len(a.describe_acls(everything(), request_timeout=T).result()) == 1
    with pytest.raises(KafkaException) as err:
        create(a, [binding()])
    assert err.value.args[0].name() == "CLUSTER_AUTHORIZATION_FAILED"
    flt = everything()
    with pytest.raises(KafkaException) as err:
        a.delete_acls([flt], request_timeout=T)[flt].result()
    assert err.value.args[0].name() == "CLUSTER_AUTHORIZATION_FAILED"
    assert len(a.describe_acls(everything(), request_timeout=T).result()) == 1


def _cli(b, *args: str) -> tuple[int, str, str]:
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "fluvial.broker", "acl", *args, "--bootstrap", b.bootstrap,
                        "--timeout", "15"], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def test_acl_cli_add_list_remove(fresh_broker, tmp_path):
    import json
    b = fresh_broker("--authorizer-enabled", "true", "--super-users", "User:ANONYMOUS")
    code, out, err = _cli(b, "add", "--principal", "User:alice", "--operation", "read", "--operation", "describe",
                          "--topic", "sales.", "--pattern", "prefixed")
    assert code == 0, err
    code, out, err = _cli(b, "add", "--principal", "User:bob", "--deny", "--operation", "write", "--topic", "orders")
    assert code == 0, err
    code, out, err = _cli(b, "list")
    listed = json.loads(out)
    assert {(d["name"], d["pattern"], d["principal"], d["operation"], d["permission"]) for d in listed} == {
        ("sales.", "PREFIXED", "User:alice", "READ", "ALLOW"), ("sales.", "PREFIXED", "User:alice", "DESCRIBE", "ALLOW"),
        ("orders", "LITERAL", "User:bob", "WRITE", "DENY")}
    code, out, err = _cli(b, "list", "--topic", "sales.q", "--pattern", "match")
    assert {d["operation"] for d in json.loads(out)} == {"READ", "DESCRIBE"}
    # Mistakes are refused with a message, not sent.
    code, out, err = _cli(b, "add", "--principal", "User:x", "--operation", "frobnicate", "--topic", "t")
    assert code != 0 and "unknown operation" in err
    code, out, err = _cli(b, "remove")
    assert code != 0 and "--all" in err
    code, out, err = _cli(b, "remove", "--principal", "User:bob")
    assert code == 0, err
    assert [d["principal"] for d in json.loads(out)["removed"]] == ["User:bob"]
    code, out, err = _cli(b, "list")
    assert {d["principal"] for d in json.loads(out)} == {"User:alice"}
    # Client properties come from a file; one the client does not know is refused by name.
    props = tmp_path / "client.properties"
    props.write_text("# admin client\nno.such.property=1\n")
    for action in (["list"], ["add", "--principal", "User:x", "--operation", "read", "--topic", "t"]):
        code, out, err = _cli(b, *action, "--command-config", str(props))
        assert code != 0 and "no.such.property" in err
    code, out, err = _cli(b, "list")
    assert {d["principal"] for d in json.loads(out)} == {"User:alice"}
