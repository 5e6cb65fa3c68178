"""Tiering configs and the local retention limit: no local copy goes before it is remote."""
from __future__ import annotations

import pytest

from fluvial.broker.config import BrokerConfig, validate_topic_configs
from fluvial.broker.tables import log_config_for
from fluvial.errors import InvalidConfigError
from tests.unit.test_log_support import meta, open_tablet, records


def test_local_retention_is_checked_against_total_retention():
    assert validate_topic_configs({"remote.storage.enable": "true", "local.retention.ms": "1000"})
    assert validate_topic_configs({"retention.ms": "-1", "local.retention.ms": "-1"})
    for bad in [{"local.retention.ms": "-3"}, {"retention.ms": "1000", "local.retention.ms": "2000"},
                {"retention.bytes": "100", "local.retention.bytes": "-1"}, {"remote.storage.enable": "yes"},
                {"local.retention.bytes": "lots"}]:
        with pytest.raises(InvalidConfigError):
            validate_topic_configs(bad)


def test_local_retention_drives_the_tablet_only_with_remote_storage():
    broker = BrokerConfig()
    plain = log_config_for({"retention.ms": "5000", "local.retention.ms": "10"}, broker)
    assert plain.retention_ms == 5000
    tiered = log_config_for({"retention.ms": "5000", "local.retention.ms": "10", "remote.storage.enable": "true"},
                            broker)
    assert tiered.retention_ms == 10
    follows = log_config_for({"retention.bytes": "777", "remote.storage.enable": "true"}, broker)
    assert follows.retention_bytes == 777  # -2: local follows retention.bytes
    broker_wide = log_config_for({"local.retention.ms": "10"}, BrokerConfig(remote_storage_enable=True))
    assert broker_wide.retention_ms == 10


def test_retention_never_deletes_past_the_remote_end(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=2000, retention_ms=0)
    for i in range(10):
        tablet.append(records(5, tag=i, first_timestamp=1000), meta())
    bases = [s.base_offset for s in tablet.segment_infos()]
    assert len(bases) >= 4
    tablet.retention_limit_offset = bases[2]  # the remote log covers the first two segments
    tablet.enforce_retention(now_ms=10**12)
    assert tablet.log_start_offset == bases[2]
    tablet.retention_limit_offset = 0
    tablet.enforce_retention(now_ms=10**12)
    assert tablet.log_start_offset == bases[2]  # nothing more until the remote end moves
    # Records below the log start (DeleteRecords) are always deletable.
    tablet.advance_log_start(bases[3])
    tablet.enforce_retention(now_ms=10**12)
    assert [s.base_offset for s in tablet.segment_infos()][0] == bases[3]
