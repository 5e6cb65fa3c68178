"""Administration of tables whose definition is fixed: primary-key tables and their changelogs."""
from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError

from tests.integration.test_pk_kafka import create


def test_primary_key_table_definition_cannot_change(broker, topic_name):
    create(broker, topic_name)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    # Rows are placed by the hash of their key: the bucket count is fixed.
    with pytest.raises(Exception) as info:
        admin.create_partitions([NewPartitions(topic_name, 6)])[topic_name].result(10)
    assert "INVALID_PARTITIONS" in str(info.value) or "bucket" in str(info.value)
    for name, value in [("fluvial.primary.key", "owner"), ("fluvial.merge.engine", "first_row"),
                        ("fluvial.value.format", "json")]:
        res = ConfigResource("topic", topic_name, set_config={name: value})
        with pytest.raises(Exception) as info:
            admin.alter_configs([res])[res].result(10)
        assert "fixed" in str(info.value), (name, info.value)
    # Other configs still change (AlterConfigs replaces every override, so it would drop the
    # fixed ones too and is refused; IncrementalAlterConfigs changes one).
    res = ConfigResource("topic", topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(10)
    described = admin.describe_configs([ConfigResource("topic", topic_name)])
    configs = list(described.values())[0].result(10)
    assert configs["retention.ms"].value == "3600000"
    assert configs["fluvial.primary.key"].value == "id"


def test_changelog_topic_cannot_be_deleted_but_the_table_can(broker, topic_name):
    create(broker, topic_name)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    assert f"{topic_name}.changelog" in admin.list_topics()
    with pytest.raises(KafkaError):
        admin.delete_topics([f"{topic_name}.changelog"])
    admin.delete_topics([topic_name])
    topics = admin.list_topics()
    assert topic_name not in topics and f"{topic_name}.changelog" not in topics
    admin.close()


def test_validate_only_alter_gives_the_same_answer_as_the_real_one(broker, topic_name):
    create(broker, topic_name)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = ConfigResource("topic", topic_name, incremental_configs=[
        ConfigEntry("fluvial.primary.key", "owner", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(Exception) as info:
        admin.incremental_alter_configs([res], validate_only=True)[res].result(10)
    assert "fixed" in str(info.value)
