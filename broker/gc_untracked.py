"""Value objects the cyclic garbage collector does not track (`_untracked.c`).

The log keeps a BatchMeta per Kafka batch and a BatchHeader per stored message of each open
segment. They hold only integers, bytes and tuples of those, so they can never be in a
reference cycle, yet every collection walked them: under many small producers they were
most of each collection's objects. Without the compiled module everything stays tracked.
"""
from __future__ import annotations

try:
    from fluvial.broker._untracked import untracked_instances as _untracked_instances
    from fluvial.broker._untracked import untracked_tuple
except ImportError:  # built without a compiler
    _untracked_instances = None

    def untracked_tuple(t: tuple) -> tuple:
        return t


def untracked(cls: type) -> type:
    """Class decorator: instances of `cls` are created untracked by the garbage collector.
    Only for classes whose instances hold numbers, bytes, strings or tuples of those."""
    if _untracked_instances is not None:
        _untracked_instances(cls)
    return cls


# untracked_tuple(t) -> t, untracked when none of its items is tracked. The collector
# untracks a tuple of atoms by itself but counts any class instance as possibly tracked, so a
# tuple of untracked instances (a coalesced message's BatchMetas) needs this.
__all__ = ["untracked", "untracked_tuple"]
