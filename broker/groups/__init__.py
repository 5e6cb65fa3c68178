"""Consumer groups: the classic group protocol coordinator and committed offsets."""
from fluvial.broker.groups.coordinator import GroupConfig, GroupCoordinator
from fluvial.broker.groups.group import Group, GroupState, Member
from fluvial.broker.groups.storage import CommittedOffset, GroupStorage

__all__ = [
    "CommittedOffset",
    "Group",
    "GroupConfig",
    "GroupCoordinator",
    "GroupState",
    "GroupStorage",
    "Member",
]
