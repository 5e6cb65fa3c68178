"""Group coordinator settings taken from the broker's configuration."""
from __future__ import annotations

from types import SimpleNamespace

from fluvial.broker.config import BrokerConfig
from fluvial.broker.groups import GroupConfig
from fluvial.broker.handlers.groups import group_config


def test_defaults_are_kafkas():
    config = group_config(SimpleNamespace(config=BrokerConfig()))
    assert config == GroupConfig()
    assert config.initial_rebalance_delay_ms == 3000
    assert config.min_session_timeout_ms == 6000
    assert config.offsets_retention_ms == 7 * 24 * 3600 * 1000


def test_broker_settings_override_defaults():
    broker_config = BrokerConfig()
    broker_config.group_initial_rebalance_delay_ms = 0
    broker_config.group_min_session_timeout_ms = 1000
    broker_config.offsets_retention_minutes = 60
    config = group_config(SimpleNamespace(config=broker_config))
    assert config.initial_rebalance_delay_ms == 0
    assert config.min_session_timeout_ms == 1000
    assert config.offsets_retention_ms == 3_600_000
