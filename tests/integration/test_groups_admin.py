"""Group administration with kafka-python's KafkaAdminClient and confluent-kafka's AdminClient."""
from __future__ import annotations

import time

import kafka.errors
import pytest
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.structs import OffsetAndMetadata


def test_group_admin_round_trips(broker, topic_name):
    kadmin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    cadmin = AdminClient({"bootstrap.servers": broker.bootstrap})
    kadmin.create_topics([NewTopic(topic_name, 3, 1)])
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(30):
        producer.send(topic_name, value=b"%d" % i, partition=i % 3)
    producer.flush()
    producer.close()
    live, idle = f"live-{topic_name}", f"idle-{topic_name}"

    # A live group with one member, and an idle group that only holds offsets (set by admin).
    consumer = KafkaConsumer(topic_name, bootstrap_servers=broker.bootstrap, group_id=live,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    deadline = time.monotonic() + 30
    while len(consumer.assignment()) < 3 and time.monotonic() < deadline:
        consumer.poll(timeout_ms=200)
    consumer.commit({TopicPartition(topic_name, 0): OffsetAndMetadata(4, "from-live", -1)})
    kadmin.alter_group_offsets(idle, {TopicPartition(topic_name, 1): OffsetAndMetadata(7, "set-by-admin", -1)})
    cadmin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(idle, [CTopicPartition(topic_name, 2, 9)])])[
        idle].result(15)

    listed = {g["group_id"]: g for g in kadmin.list_groups()}
    assert listed[live]["group_state"] == "Stable" and listed[idle]["group_state"] == "Empty"
    clisted = cadmin.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(15)
    assert idle in {g.group_id for g in clisted.valid} and live not in {g.group_id for g in clisted.valid}

    desc = cadmin.describe_consumer_groups([live])[live].result(15)
    assert desc.state == ConsumerGroupState.STABLE and desc.partition_assignor == "range"
    assert sorted(tp.partition for tp in desc.members[0].assignment.topic_partitions) == [0, 1, 2]

    offsets = kadmin.list_group_offsets({idle: None})[idle]
    assert offsets[TopicPartition(topic_name, 1)].offset == 7
    assert offsets[TopicPartition(topic_name, 1)].metadata == "set-by-admin"
    assert offsets[TopicPartition(topic_name, 2)].offset == 9
    res = cadmin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(live)])[live].result(15)
    assert {tp.partition: tp.offset for tp in res.topic_partitions} == {0: 4}

    # Offsets of a topic the live group consumes cannot be deleted; the idle group's can.
    deleted = kadmin.delete_group_offsets(live, [TopicPartition(topic_name, 0)])
    assert deleted == {TopicPartition(topic_name, 0): kafka.errors.GroupSubscribedToTopicError}
    deleted = kadmin.delete_group_offsets(idle, [TopicPartition(topic_name, 1)])
    assert deleted == {TopicPartition(topic_name, 1): kafka.errors.NoError}
    assert TopicPartition(topic_name, 1) not in kadmin.list_group_offsets({idle: None})[idle]

    # Deleting: a live group is refused, an idle one goes with its offsets.
    futures = cadmin.delete_consumer_groups([live, idle])
    futures[idle].result(15)
    with pytest.raises(KafkaException) as refused:
        futures[live].result(15)
    assert refused.value.args[0].code() == 68  # NON_EMPTY_GROUP
    assert idle not in {g["group_id"] for g in kadmin.list_groups()}
    assert kadmin.list_group_offsets({idle: None})[idle] == {}

    consumer.close()
    assert kadmin.delete_groups([live]) == {live: "OK"}
    assert live not in {g["group_id"] for g in kadmin.list_groups()}
    kadmin.close()
