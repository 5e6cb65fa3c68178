"""ACL matrix: for every Kafka API the broker serves, one principal allowed (alice) and one
denied (bob); every denied call answers Kafka's error code and changes nothing.

Principals log in with SASL PLAIN. Requests go over the wire one by one (tests/support/
kafka_wire.py) so that each API's exact answer is checked; the ACLs themselves are created
with confluent-kafka's AdminClient as the super user, and a real producer and consumer check
the same refusals the way applications see them.
"""
from __future__ import annotations

import json
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic,
                                   ResourcePatternType, ResourceType)

from kafka.record import MemoryRecordsBuilder

from fluvial.broker import handlers
from fluvial.protocol.messages import REQUEST_CLASSES, ApiKey
from tests.support.kafka_wire import WireClient

pytestmark = pytest.mark.timeout(180)

USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
NONE, TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED = 0, 29, 30, 31, 53
T = 15
R = REQUEST_CLASSES


def sasl(user: str) -> dict:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": USERS[user]}


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    from tests.support.broker_process import BrokerProcess
    args = ["--authorizer-enabled", "true", "--super-users", "User:admin", "--security-protocol", "SASL_PLAINTEXT",
            "--auto-create-topics", "true"]
    for name, password in USERS.items():
        args += ["--user", f"{name}={password}"]
    b = BrokerProcess(tmp_path_factory.mktemp("acl-matrix") / "data", *args).start()
    admin = AdminClient({"bootstrap.servers": b.bootstrap, **sasl("admin")})
    acl = lambda rt, name, pt, who, op, perm=AclPermissionType.ALLOW: AclBinding(  # noqa: E731
        rt, name, pt, f"User:{who}", "*", op, perm)
    L, P = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    A = AclOperation
    bindings = [
        # alice: everything on topics and groups under "m." / "g.", the cluster, transactional id tx-a.
        acl(ResourceType.TOPIC, "m.", P, "alice", A.ALL),
        acl(ResourceType.GROUP, "g.", P, "alice", A.ALL),
        acl(ResourceType.BROKER, "kafka-cluster", L, "alice", A.ALL),
        acl(ResourceType.TRANSACTIONAL_ID, "tx-a", L, "alice", A.ALL),
        # bob: may see one topic; may read but not write m.deny (deny beats allow); reads the
        # table m.pk, whose changelog follows it.
        acl(ResourceType.TOPIC, "m.visible", L, "bob", A.DESCRIBE),
        acl(ResourceType.TOPIC, "m.deny", L, "bob", A.ALL),
        acl(ResourceType.TOPIC, "m.deny", L, "bob", A.WRITE, AclPermissionType.DENY),
        acl(ResourceType.TOPIC, "m.pk", L, "bob", A.READ),
    ]
    for fut in admin.create_acls(bindings, request_timeout=T).values():
        fut.result()
    topics = [NewTopic(n, 1, 1) for n in ("m.t1", "m.visible", "m.deny", "m.hidden")]
    topics.append(NewTopic("m.pk", 1, 1, config={
        "fluvial.value.format": "avro", "fluvial.primary.key": "id",
        "fluvial.value.schema": json.dumps({"type": "record", "name": "Row", "fields": [
            {"name": "id", "type": "long"}, {"name": "v", "type": "string"}]})}))
    for fut in admin.create_topics(topics, request_timeout=T).values():
        fut.result()
    p = Producer({"bootstrap.servers": b.bootstrap, **sasl("admin")})
    for i in range(5):
        p.produce("m.t1", key=b"k%d" % i, value=b"v%d" % i)
        p.produce("m.deny", value=b"d%d" % i)
    assert p.flush(T) == 0
    yield b
    b.stop()


def wire(b, user: str) -> WireClient:
    return WireClient(b.bootstrap, user, USERS[user])


def hw(b, topic: str, partition: int = 0) -> tuple[int, int]:
    """(log start, high watermark) as the super user sees them."""
    with wire(b, "admin") as c:
        LO = R[ApiKey.LIST_OFFSETS]
        out = []
        for ts in (-2, -1):
            r = c.request(ApiKey.LIST_OFFSETS, 7, dict(replica_id=-1, isolation_level=0, topics=[
                LO.ListOffsetsTopic(name=topic, partitions=[LO.ListOffsetsTopic.ListOffsetsPartition(
                    partition_index=partition, current_leader_epoch=-1, timestamp=ts)])]))
            out.append(r.topics[0].partitions[0].offset)
        return out[0], out[1]


def topic_names(b, user: str) -> set[str]:
    with wire(b, user) as c:
        r = c.request(ApiKey.METADATA, 12, dict(topics=None, allow_auto_topic_creation=False,
                                                include_topic_authorized_operations=False))
        return {t.name for t in r.topics}


# ---- one request per API -------------------------------------------------------------------

def produce(c: WireClient, topic: str, transactional_id: str | None = None) -> int:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    builder.append(timestamp=int(time.time() * 1000), key=b"k", value=b"v", headers=[])
    builder.close()
    P = R[ApiKey.PRODUCE]
    r = c.request(ApiKey.PRODUCE, 9, dict(transactional_id=transactional_id, acks=-1, timeout_ms=5000, topic_data=[
        P.TopicProduceData(name=topic, partition_data=[P.TopicProduceData.PartitionProduceData(
            index=0, records=bytes(builder.buffer()))])]))
    return r.responses[0].partition_responses[0].error_code


def fetch(c: WireClient, topic: str) -> tuple[int, int]:
    F = R[ApiKey.FETCH]
    r = c.request(ApiKey.FETCH, 12, dict(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                                         isolation_level=0, session_id=0, session_epoch=-1, topics=[
        F.FetchTopic(topic=topic, partitions=[F.FetchTopic.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
            partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id=""))
    p = r.responses[0].partitions[0]
    return p.error_code, len(p.records or b"")


def list_offsets(c: WireClient, topic: str) -> int:
    LO = R[ApiKey.LIST_OFFSETS]
    r = c.request(ApiKey.LIST_OFFSETS, 7, dict(replica_id=-1, isolation_level=0, topics=[
        LO.ListOffsetsTopic(name=topic, partitions=[LO.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=-1)])]))
    return r.topics[0].partitions[0].error_code


def leader_epoch(c: WireClient, topic: str) -> int:
    O = R[ApiKey.OFFSET_FOR_LEADER_EPOCH]
    r = c.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, dict(replica_id=-1, topics=[O.OffsetForLeaderTopic(
        topic=topic, partitions=[O.OffsetForLeaderTopic.OffsetForLeaderPartition(
            partition=0, current_leader_epoch=-1, leader_epoch=0)])]))
    return r.topics[0].partitions[0].error_code


def metadata(c: WireClient, topics: list[str] | None, create: bool = False):
    M = R[ApiKey.METADATA]
    return c.request(ApiKey.METADATA, 12, dict(
        topics=None if topics is None else [M.MetadataRequestTopic(name=t, topic_id=uuid.UUID(int=0)) for t in topics],
        allow_auto_topic_creation=create, include_topic_authorized_operations=True))


# ---- the matrix ----------------------------------------------------------------------------

def test_every_served_api_is_in_the_matrix():
    """A new API added to the broker must get its row here (and its check in its handler)."""
    covered = {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 28, 29, 30, 31,
               32, 33, 35, 36, 65, 66,
               37, 42, 44, 47, 48, 50, 51, 60, 68, 69, 75, 76, 77, 78, 79}  # 48 DescribeClientQuotas: test_kafka_tls.py
    handlers.load_all()
    assert set(handlers.supported_versions()) <= covered


def test_produce_fetch_offsets(secured):
    b = secured
    before = hw(b, "m.t1")
    with wire(b, "alice") as alice, wire(b, "bob") as bob:
        assert produce(bob, "m.t1") == TOPIC_DENIED
        assert hw(b, "m.t1") == before                      # nothing appended
        assert produce(alice, "m.t1") == NONE
        assert hw(b, "m.t1")[1] == before[1] + 1
        assert fetch(bob, "m.t1") == (TOPIC_DENIED, 0)
        code, size = fetch(alice, "m.t1")
        assert code == NONE and size > 0
        assert list_offsets(bob, "m.t1") == TOPIC_DENIED
        assert list_offsets(alice, "m.t1") == NONE
        assert leader_epoch(bob, "m.t1") == TOPIC_DENIED
        assert leader_epoch(alice, "m.t1") == NONE
        # Outside alice's prefix: denied to her too; a topic that does not exist is not revealed.
        assert produce(alice, "x.other") == TOPIC_DENIED
        assert list_offsets(bob, "no.such.topic") == TOPIC_DENIED


def test_deny_beats_allow(secured):
    b = secured
    before = hw(b, "m.deny")
    with wire(b, "bob") as bob:
        assert produce(bob, "m.deny") == TOPIC_DENIED      # ALLOW ALL, DENY WRITE
        code, size = fetch(bob, "m.deny")                   # READ still allowed
        assert code == NONE and size > 0
    assert hw(b, "m.deny") == before


def test_changelog_follows_its_table(secured):
    b = secured
    with wire(b, "bob") as bob:
        assert fetch(bob, "m.pk.changelog")[0] == NONE     # READ on m.pk covers its changelog
        assert list_offsets(bob, "m.pk.changelog") == NONE  # DESCRIBE implied by READ
        assert fetch(bob, "m.hidden")[0] == TOPIC_DENIED


def test_metadata_hides_what_cannot_be_described(secured):
    b = secured
    # The changelog of a table bob may read is listed with it.
    assert topic_names(b, "bob") == {"m.visible", "m.deny", "m.pk", "m.pk.changelog"}
    assert {"m.t1", "m.visible", "m.deny", "m.hidden", "m.pk"} <= topic_names(b, "alice")
    with wire(b, "bob") as bob:
        r = metadata(bob, ["m.hidden", "m.visible"])
        codes = {t.name: t.error_code for t in r.topics}
        assert codes == {"m.hidden": TOPIC_DENIED, "m.visible": NONE}
        ops = {t.name: t.authorized_operations for t in r.topics}
        assert ops["m.visible"] == {8}                      # DESCRIBE only
        # Auto-creation needs CREATE: refused, nothing created.
        r = metadata(bob, ["m.auto-bob"], create=True)
        assert r.topics[0].error_code == TOPIC_DENIED
    assert "m.auto-bob" not in topic_names(b, "admin")
    with wire(b, "alice") as alice:
        r = metadata(alice, ["m.auto-alice"], create=True)
        assert r.topics[0].error_code == NONE
        assert r.topics[0].authorized_operations == {3, 4, 5, 6, 7, 8, 10, 11}  # every topic operation
    assert "m.auto-alice" in topic_names(b, "admin")


def test_describe_cluster_and_topic_partitions(secured):
    b = secured
    DT = R[ApiKey.DESCRIBE_TOPIC_PARTITIONS]
    with wire(b, "alice") as alice, wire(b, "bob") as bob:
        ra = alice.request(ApiKey.DESCRIBE_CLUSTER, 1, dict(include_cluster_authorized_operations=True,
                                                            endpoint_type=1))
        rb = bob.request(ApiKey.DESCRIBE_CLUSTER, 1, dict(include_cluster_authorized_operations=True, endpoint_type=1))
        assert ra.error_code == rb.error_code == NONE
        assert ra.authorized_operations == {5, 7, 8, 9, 10, 11, 12} and rb.authorized_operations == set()
        body = dict(topics=[DT.TopicRequest(name="m.t1")], response_partition_limit=100, cursor=None)
        assert alice.request(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, body).topics[0].error_code == NONE
        assert bob.request(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, body).topics[0].error_code == TOPIC_DENIED
        every = bob.request(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, dict(topics=[], response_partition_limit=100,
                                                                      cursor=None))
        assert {t.name for t in every.topics} <= {"m.visible", "m.deny", "m.pk", "m.pk.changelog"}
        assert {"m.visible", "m.deny", "m.pk"} <= {t.name for t in every.topics}


def test_topic_administration(secured):
    b = secured
    CT, DT, CP, DR = (R[k] for k in (ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS,
                                     ApiKey.DELETE_RECORDS))
    create = dict(topics=[CT.CreatableTopic(name="m.c1", num_partitions=1, replication_factor=1, assignments=[],
                                            configs=[])], timeout_ms=5000, validate_only=False)
    with wire(b, "alice") as alice, wire(b, "bob") as bob:
        assert bob.request(ApiKey.CREATE_TOPICS, 7, create).topics[0].error_code == TOPIC_DENIED
        assert "m.c1" not in topic_names(b, "admin")
        assert alice.request(ApiKey.CREATE_TOPICS, 7, create).topics[0].error_code == NONE

        grow = dict(topics=[CP.CreatePartitionsTopic(name="m.c1", count=2, assignments=None)], timeout_ms=5000,
                    validate_only=False)
        assert bob.request(ApiKey.CREATE_PARTITIONS, 3, grow).results[0].error_code == TOPIC_DENIED
        assert alice.request(ApiKey.CREATE_PARTITIONS, 3, grow).results[0].error_code == NONE

        before = hw(b, "m.t1")
        trim = dict(topics=[DR.DeleteRecordsTopic(name="m.t1", partitions=[
            DR.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=1)])], timeout_ms=5000)
        assert bob.request(ApiKey.DELETE_RECORDS, 2, trim).topics[0].partitions[0].error_code == TOPIC_DENIED
        assert hw(b, "m.t1") == before
        assert alice.request(ApiKey.DELETE_RECORDS, 2, trim).topics[0].partitions[0].error_code == NONE
        assert hw(b, "m.t1")[0] == 1

        delete = dict(topics=[DT.DeleteTopicState(name="m.c1", topic_id=uuid.UUID(int=0))], timeout_ms=5000)
        assert bob.request(ApiKey.DELETE_TOPICS, 6, delete).responses[0].error_code == TOPIC_DENIED
        assert "m.c1" in topic_names(b, "admin")
        assert alice.request(ApiKey.DELETE_TOPICS, 6, delete).responses[0].error_code == NONE
        assert "m.c1" not in topic_names(b, "admin")


def test_configs(secured):
    b = secured
    DC, AC, IAC = R[ApiKey.DESCRIBE_CONFIGS], R[ApiKey.ALTER_CONFIGS], R[ApiKey.INCREMENTAL_ALTER_CONFIGS]

    def describe(c, rtype, name):
        r = c.request(ApiKey.DESCRIBE_CONFIGS, 4, dict(resources=[DC.DescribeConfigsResource(
            resource_type=rtype, resource_name=name, configuration_keys=None)], include_synonyms=False,
            include_documentation=False))
        return r.results[0]

    def retention(c) -> str:
        return {e.name: e.value for e in describe(c, 2, "m.t1").configs}["retention.ms"]

    with wire(b, "alice") as alice, wire(b, "bob") as bob, wire(b, "admin") as admin:
        assert describe(bob, 2, "m.t1").error_code == TOPIC_DENIED
        assert describe(alice, 2, "m.t1").error_code == NONE
        assert describe(bob, 4, "1").error_code == CLUSTER_DENIED
        assert describe(alice, 4, "1").error_code == NONE
        was = retention(admin)
        alter = dict(resources=[AC.AlterConfigsResource(resource_type=2, resource_name="m.t1", configs=[
            AC.AlterConfigsResource.AlterableConfig(name="retention.ms", value="123456")])], validate_only=False)
        assert bob.request(ApiKey.ALTER_CONFIGS, 2, alter).responses[0].error_code == TOPIC_DENIED
        assert retention(admin) == was
        inc = dict(resources=[IAC.AlterConfigsResource(resource_type=2, resource_name="m.t1", configs=[
            IAC.AlterConfigsResource.AlterableConfig(name="retention.ms", config_operation=0, value="654321")])],
            validate_only=False)
        assert bob.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, inc).responses[0].error_code == TOPIC_DENIED
        assert retention(admin) == was
        assert alice.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, inc).responses[0].error_code == NONE
        assert retention(admin) == "654321"
        assert alice.request(ApiKey.ALTER_CONFIGS, 2, alter).responses[0].error_code == NONE
        assert retention(admin) == "123456"
        logdirs = dict(topics=None)
        assert bob.request(ApiKey.DESCRIBE_LOG_DIRS, 4, logdirs).error_code == CLUSTER_DENIED
        assert alice.request(ApiKey.DESCRIBE_LOG_DIRS, 4, logdirs).error_code == NONE


def test_producer_ids(secured):
    b = secured
    with wire(b, "alice") as alice, wire(b, "bob") as bob:
        idem = dict(transactional_id=None, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1)
        assert bob.request(ApiKey.INIT_PRODUCER_ID, 4, idem).error_code == CLUSTER_DENIED
        assert alice.request(ApiKey.INIT_PRODUCER_ID, 4, idem).error_code == NONE
        txn = dict(idem, transactional_id="tx-a")
        assert bob.request(ApiKey.INIT_PRODUCER_ID, 4, txn).error_code == TXN_DENIED
        assert produce(bob, "m.deny", transactional_id="tx-a") == TXN_DENIED
        F = R[ApiKey.FIND_COORDINATOR]
        r = bob.request(ApiKey.FIND_COORDINATOR, 4, dict(key_type=1, coordinator_keys=["tx-a"]))
        assert r.coordinators[0].error_code == TXN_DENIED
        r = alice.request(ApiKey.FIND_COORDINATOR, 4, dict(key_type=1, coordinator_keys=["tx-a"]))
        assert r.coordinators[0].error_code == NONE
        del F


def test_groups(secured):
    b = secured
    JG, SG, OC, OF, OD = (R[k] for k in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.OFFSET_COMMIT,
                                         ApiKey.OFFSET_FETCH, ApiKey.OFFSET_DELETE))
    g = "g.one"

    def groups_of(c) -> set[str]:
        return {x.group_id for x in c.request(ApiKey.LIST_GROUPS, 4, dict(states_filter=[])).groups}

    with wire(b, "alice") as alice, wire(b, "bob") as bob, wire(b, "admin") as admin:
        r = bob.request(ApiKey.FIND_COORDINATOR, 4, dict(key_type=0, coordinator_keys=[g]))
        assert r.coordinators[0].error_code == GROUP_DENIED
        r = alice.request(ApiKey.FIND_COORDINATOR, 4, dict(key_type=0, coordinator_keys=[g]))
        assert r.coordinators[0].error_code == NONE

        join = dict(group_id=g, session_timeout_ms=30000, rebalance_timeout_ms=30000, member_id="",
                    group_instance_id=None, protocol_type="consumer",
                    protocols=[JG.JoinGroupRequestProtocol(name="range", metadata=b"")])
        assert bob.request(ApiKey.JOIN_GROUP, 3, join).error_code == GROUP_DENIED
        assert g not in groups_of(admin)
        joined = alice.request(ApiKey.JOIN_GROUP, 3, join)
        assert joined.error_code == NONE
        member, gen = joined.member_id, joined.generation_id
        sync = dict(group_id=g, generation_id=gen, member_id=member, group_instance_id=None,
                    assignments=[SG.SyncGroupRequestAssignment(member_id=member, assignment=b"")])
        assert bob.request(ApiKey.SYNC_GROUP, 3, sync).error_code == GROUP_DENIED
        assert alice.request(ApiKey.SYNC_GROUP, 3, sync).error_code == NONE
        beat = dict(group_id=g, generation_id=gen, member_id=member, group_instance_id=None)
        assert bob.request(ApiKey.HEARTBEAT, 3, beat).error_code == GROUP_DENIED
        assert alice.request(ApiKey.HEARTBEAT, 3, beat).error_code == NONE

        def commit(c, offset):
            r = c.request(ApiKey.OFFSET_COMMIT, 8, dict(
                group_id=g, generation_id_or_member_epoch=gen, member_id=member, group_instance_id=None,
                topics=[OC.OffsetCommitRequestTopic(name="m.t1", partitions=[
                    OC.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=offset, committed_leader_epoch=-1,
                        committed_metadata="")])]))
            return r.topics[0].partitions[0].error_code

        def committed(c):
            r = c.request(ApiKey.OFFSET_FETCH, 8, dict(groups=[OF.OffsetFetchRequestGroup(
                group_id=g, topics=[OF.OffsetFetchRequestGroup.OffsetFetchRequestTopics(
                    name="m.t1", partition_indexes=[0])])], require_stable=False))
            grp = r.groups[0]
            return grp.error_code, (grp.topics[0].partitions[0].committed_offset if grp.topics else None)

        assert commit(bob, 3) == GROUP_DENIED
        assert commit(alice, 2) == NONE
        assert commit(bob, 4) == GROUP_DENIED
        assert committed(bob) == (GROUP_DENIED, None)
        # OffsetFetch v1 has no group-level error: the partitions carry it.
        v1 = bob.request(ApiKey.OFFSET_FETCH, 1, dict(group_id=g, topics=[OF.OffsetFetchRequestTopic(
            name="m.t1", partition_indexes=[0])]))
        assert v1.topics[0].partitions[0].error_code == GROUP_DENIED
        assert committed(alice) == (NONE, 2)

        described = bob.request(ApiKey.DESCRIBE_GROUPS, 5, dict(groups=[g], include_authorized_operations=True))
        assert described.groups[0].error_code == GROUP_DENIED and described.groups[0].members == []
        described = alice.request(ApiKey.DESCRIBE_GROUPS, 5, dict(groups=[g], include_authorized_operations=True))
        assert described.groups[0].error_code == NONE and len(described.groups[0].members) == 1
        assert described.groups[0].authorized_operations == {3, 6, 8}   # READ, DELETE, DESCRIBE
        assert g not in groups_of(bob) and g in groups_of(alice)

        leave = dict(group_id=g, members=[R[ApiKey.LEAVE_GROUP].MemberIdentity(member_id=member,
                                                                                group_instance_id=None)])
        assert bob.request(ApiKey.LEAVE_GROUP, 3, leave).error_code == GROUP_DENIED
        assert alice.request(ApiKey.LEAVE_GROUP, 3, leave).error_code == NONE

        od = dict(group_id=g, topics=[OD.OffsetDeleteRequestTopic(name="m.t1", partitions=[
            OD.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=0)])])
        assert bob.request(ApiKey.OFFSET_DELETE, 0, od).error_code == GROUP_DENIED
        assert committed(alice) == (NONE, 2)
        r = alice.request(ApiKey.OFFSET_DELETE, 0, od)
        assert r.error_code == NONE and r.topics[0].partitions[0].error_code == NONE
        assert committed(alice) == (NONE, -1)

        # The group (now empty) keeps a committed offset until it is deleted.
        gen, member = -1, ""
        assert commit(alice, 1) == NONE
        assert bob.request(ApiKey.DELETE_GROUPS, 2, dict(groups_names=[g])).results[0].error_code == GROUP_DENIED
        assert committed(alice) == (NONE, 1)
        assert alice.request(ApiKey.DELETE_GROUPS, 2, dict(groups_names=[g])).results[0].error_code == NONE
        assert committed(alice) == (NONE, -1)


def test_acl_apis_and_api_versions(secured):
    b = secured
    DA, CA, DL = R[ApiKey.DESCRIBE_ACLS], R[ApiKey.CREATE_ACLS], R[ApiKey.DELETE_ACLS]
    flt = dict(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
               host_filter=None, operation=1, permission_type=1)
    new = CA.AclCreation(resource_type=2, resource_name="m.bob", resource_pattern_type=3, principal="User:bob",
                         host="*", operation=3, permission_type=3)
    with wire(b, "alice") as alice, wire(b, "bob") as bob:
        assert bob.request(ApiKey.API_VERSIONS, 3, dict(client_software_name="t", client_software_version="1")
                           ).error_code == NONE
        assert bob.request(ApiKey.DESCRIBE_ACLS, 3, flt).error_code == CLUSTER_DENIED
        count = len(alice.request(ApiKey.DESCRIBE_ACLS, 3, flt).resources)
        assert bob.request(ApiKey.CREATE_ACLS, 3, dict(creations=[new])).results[0].error_code == CLUSTER_DENIED
        assert bob.request(ApiKey.DELETE_ACLS, 3, dict(filters=[DL.DeleteAclsFilter(**flt)])
                           ).filter_results[0].error_code == CLUSTER_DENIED
        assert len(alice.request(ApiKey.DESCRIBE_ACLS, 3, flt).resources) == count
        # Bad filters: INVALID_REQUEST.
        bad = dict(flt, pattern_type_filter=0)
        assert alice.request(ApiKey.DESCRIBE_ACLS, 3, bad).error_code == 42
        del DA


def test_real_clients_see_the_same_refusals(secured):
    b = secured
    # confluent-kafka producer as bob: TOPIC_AUTHORIZATION_FAILED.
    errors = []
    p = Producer({"bootstrap.servers": b.bootstrap, **sasl("bob"), "message.timeout.ms": 10000,
                  "enable.idempotence": False})
    p.produce("m.deny", value=b"x", on_delivery=lambda e, m: errors.append(e))
    p.flush(T)
    assert errors and errors[0] is not None and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # alice produces and consumes through her prefix, with a group of hers.
    p = Producer({"bootstrap.servers": b.bootstrap, **sasl("alice")})
    p.produce("m.visible", value=b"hello")
    assert p.flush(T) == 0
    c = Consumer({"bootstrap.servers": b.bootstrap, **sasl("alice"), "group.id": "g.real",
                  "auto.offset.reset": "earliest"})
    c.subscribe(["m.visible"])
    got = None
    for _ in range(30):
        m = c.poll(1)
        if m is not None and not m.error():
            got = m.value()
            break
    c.close()
    assert got == b"hello"
    # bob's consumer: its group is not his.
    c = Consumer({"bootstrap.servers": b.bootstrap, **sasl("bob"), "group.id": "g.real",
                  "auto.offset.reset": "earliest"})
    c.subscribe(["m.deny"])
    err = None
    for _ in range(15):
        m = c.poll(1)
        if m is not None and m.error():
            err = m.error()
            break
    c.close()
    assert err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    # An admin client as bob cannot create topics.
    admin = AdminClient({"bootstrap.servers": b.bootstrap, **sasl("bob")})
    with pytest.raises(KafkaException) as e:
        admin.create_topics([NewTopic("m.bob-new", 1, 1)], request_timeout=T)["m.bob-new"].result()
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_acl_cli_over_sasl(secured, tmp_path):
    import os
    import subprocess
    import sys
    b = secured

    def cli(*args: str, env_password: str | None = None):
        env = dict(os.environ)
        env.pop("FLUVIAL_PASSWORD", None)
        if env_password is not None:
            env["FLUVIAL_PASSWORD"] = env_password
        return subprocess.run([sys.executable, "-m", "fluvial.broker", "acl", *args, "--bootstrap", b.bootstrap,
                               "--timeout", "15", "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism",
                               "PLAIN"], capture_output=True, text=True, timeout=60, env=env)

    p = cli("add", "--username", "admin", "--principal", "User:bob", "--operation", "describe", "--topic", "m.cli",
            env_password=USERS["admin"])
    assert p.returncode == 0, p.stderr
    pw = tmp_path / "bob.pw"
    pw.write_text(USERS["bob"] + "\n")
    # bob may not list ACLs: the tool reports the broker's refusal and fails.
    p = cli("list", "--username", "bob", "--password-file", str(pw))
    assert p.returncode != 0 and "ClusterAuthorizationFailed" in p.stderr
    p = cli("list", "--username", "admin", "--topic", "m.cli", env_password=USERS["admin"])
    assert p.returncode == 0 and [d["principal"] for d in json.loads(p.stdout)] == ["User:bob"]
    p = cli("remove", "--username", "admin", "--topic", "m.cli", env_password=USERS["admin"])
    assert p.returncode == 0 and len(json.loads(p.stdout)["removed"]) == 1
    p = cli("list", "--username", "admin")
    assert p.returncode != 0 and "FLUVIAL_PASSWORD" in p.stderr


def test_user_credentials(secured):
    b = secured
    AU = R[51]

    def users(c) -> tuple[int, set[str]]:
        r = c.request(50, 0, dict(users=None))
        return r.error_code, {x.user for x in r.results}

    upsert = dict(deletions=[], upsertions=[AU.ScramCredentialUpsertion(
        name="carol", mechanism=2, iterations=8192, salt=b"s" * 16, salted_password=b"p" * 64)])
    with wire(b, "alice") as alice, wire(b, "bob") as bob, wire(b, "admin") as admin:
        assert users(bob)[0] == CLUSTER_DENIED
        code, names = users(alice)
        assert code == NONE and {"alice", "bob"} <= names
        assert bob.request(51, 0, upsert).results[0].error_code == CLUSTER_DENIED
        assert "carol" not in users(admin)[1]
        assert alice.request(51, 0, upsert).results[0].error_code == NONE
        assert "carol" in users(admin)[1]


def test_consumer_groups(secured):
    """KIP-848: heartbeat needs READ on the group and DESCRIBE on the subscribed topics;
    ConsumerGroupDescribe needs DESCRIBE on the group."""
    g = "g.kip848"

    def beat(c, topics):
        return c.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, dict(
            group_id=g, member_id="m-1", member_epoch=0, instance_id=None, rack_id=None,
            rebalance_timeout_ms=30000, subscribed_topic_names=topics, subscribed_topic_regex=None,
            server_assignor=None, topic_partitions=[]))

    def describe(c):
        return c.request(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, dict(group_ids=[g],
                                                                 include_authorized_operations=False)).groups[0]

    with wire(secured, "alice") as alice, wire(secured, "bob") as bob, wire(secured, "admin") as admin:
        assert beat(bob, ["m.visible"]).error_code == GROUP_DENIED
        assert describe(admin).error_code == 69  # GROUP_ID_NOT_FOUND: nothing was created
        assert beat(alice, ["m.t1", "other.topic"]).error_code == TOPIC_DENIED
        assert describe(admin).error_code == 69
        joined = beat(alice, ["m.t1"])
        assert (joined.error_code, joined.member_epoch) == (NONE, 1)
        assert describe(bob).error_code == GROUP_DENIED
        d = describe(alice)
        assert d.error_code == NONE and [m.member_id for m in d.members] == ["m-1"]


def test_share_groups(secured):
    """KIP-932: heartbeat, fetch and acknowledge need READ on the group (and DESCRIBE on the
    subscribed topics, READ on fetched ones); ShareGroupDescribe needs DESCRIBE on the group."""
    g = "g.share"
    SF = R[ApiKey.SHARE_FETCH]

    def beat(c, topics):
        return c.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, dict(group_id=g, member_id="s-1", member_epoch=0,
                                                               rack_id=None, subscribed_topic_names=topics))

    def fetch(c, topic_id):
        r = c.request(ApiKey.SHARE_FETCH, 2, dict(
            group_id=g, member_id="s-1", share_session_epoch=0, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
            max_records=10, batch_size=10, share_acquire_mode=0, is_renew_ack=False,
            topics=[SF.FetchTopic(topic_id=topic_id, partitions=[SF.FetchTopic.FetchPartition(
                partition_index=0, partition_max_bytes=0, acknowledgement_batches=[])])], forgotten_topics_data=[]))
        return r.error_code, [p.error_code for t in r.responses for p in t.partitions]

    def describe(c):
        return c.request(ApiKey.SHARE_GROUP_DESCRIBE, 1, dict(group_ids=[g],
                                                              include_authorized_operations=False)).groups[0]

    with wire(secured, "alice") as alice, wire(secured, "bob") as bob, wire(secured, "admin") as admin:
        assert beat(bob, ["m.visible"]).error_code == GROUP_DENIED
        assert describe(admin).error_code == 69
        assert beat(alice, ["m.t1", "other.topic"]).error_code == TOPIC_DENIED
        joined = beat(alice, ["m.t1"])
        assert joined.error_code == NONE
        topic_id = joined.assignment.topic_partitions[0].topic_id
        assert fetch(bob, topic_id)[0] == GROUP_DENIED
        assert fetch(alice, topic_id) == (NONE, [])
        assert bob.request(ApiKey.SHARE_ACKNOWLEDGE, 2, dict(
            group_id=g, member_id="s-1", share_session_epoch=1, is_renew_ack=False, topics=[])).error_code \
            == GROUP_DENIED
        assert describe(bob).error_code == GROUP_DENIED
        assert describe(alice).error_code == NONE


def test_transactions(secured):
    """Kafka's checks: WRITE on the transactional id for every transactional request, WRITE on
    each topic added, READ on the group for AddOffsetsToTxn / TxnOffsetCommit, CLUSTER_ACTION
    for the batched AddPartitionsToTxn, DESCRIBE on the id to describe or list it."""
    b = secured
    AP, TO = R[ApiKey.ADD_PARTITIONS_TO_TXN], R[ApiKey.TXN_OFFSET_COMMIT]

    def add(c, tid, pid, epoch, topic):
        r = c.request(ApiKey.ADD_PARTITIONS_TO_TXN, 3, dict(
            v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[AP.AddPartitionsToTxnTopic(name=topic, partitions=[0])]))
        return r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code

    def offsets(c, tid, pid, epoch, group):
        r = c.request(ApiKey.TXN_OFFSET_COMMIT, 3, dict(
            transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1,
            member_id="", group_instance_id=None, topics=[TO.TxnOffsetCommitRequestTopic(name="m.t1", partitions=[
                TO.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
                    partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata="")])]))
        return r.topics[0].partitions[0].error_code

    with wire(b, "alice") as alice, wire(b, "bob") as bob:
        init = dict(transactional_id="tx-a", transaction_timeout_ms=30000, producer_id=-1, producer_epoch=-1)
        assert bob.request(ApiKey.INIT_PRODUCER_ID, 4, init).error_code == TXN_DENIED
        r = alice.request(ApiKey.INIT_PRODUCER_ID, 4, init)
        pid, epoch = r.producer_id, r.producer_epoch
        assert add(bob, "tx-a", pid, epoch, "m.t1") == TXN_DENIED
        assert add(alice, "tx-a", pid, epoch, "other.topic") == TOPIC_DENIED
        assert add(alice, "tx-a", pid, epoch, "m.t1") == NONE
        ao = dict(transactional_id="tx-a", producer_id=pid, producer_epoch=epoch, group_id="other.group")
        assert bob.request(ApiKey.ADD_OFFSETS_TO_TXN, 3, ao).error_code == TXN_DENIED
        assert alice.request(ApiKey.ADD_OFFSETS_TO_TXN, 3, ao).error_code == GROUP_DENIED
        assert alice.request(ApiKey.ADD_OFFSETS_TO_TXN, 3, {**ao, "group_id": "g.tx"}).error_code == NONE
        assert offsets(bob, "tx-a", pid, epoch, "g.tx") == TXN_DENIED
        assert offsets(alice, "tx-a", pid, epoch, "other.group") == GROUP_DENIED
        assert offsets(alice, "tx-a", pid, epoch, "g.tx") == NONE
        batched = bob.request(ApiKey.ADD_PARTITIONS_TO_TXN, 4, dict(transactions=[]))
        assert batched.error_code == CLUSTER_DENIED
        d = bob.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, dict(transactional_ids=["tx-a"]))
        assert d.transaction_states[0].error_code == TXN_DENIED
        assert alice.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, dict(transactional_ids=["tx-a"])
                             ).transaction_states[0].transaction_state == "Ongoing"
        listed = dict(state_filters=[], producer_id_filters=[], duration_filter=-1)
        assert bob.request(ApiKey.LIST_TRANSACTIONS, 1, listed).transaction_states == []
        assert [t.transactional_id for t in alice.request(ApiKey.LIST_TRANSACTIONS, 1, listed
                                                           ).transaction_states] == ["tx-a"]
        end = dict(transactional_id="tx-a", producer_id=pid, producer_epoch=epoch, committed=False)
        assert bob.request(ApiKey.END_TXN, 3, end).error_code == TXN_DENIED
        assert alice.request(ApiKey.END_TXN, 3, end).error_code == NONE
