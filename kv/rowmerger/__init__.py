"""Row mergers: how a write combines with the current row of its key (one round of keys at a time)."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.errors import InvalidConfigError, InvalidRecordError


class MergeEngine(str, enum.Enum):
    LAST_ROW = "last_row"
    FIRST_ROW = "first_row"
    VERSIONED = "versioned"
    RETRACT = "retract"  # per key the list of live rows: reordered changelogs materialize right
    AGGREGATION = "aggregation"  # per non-key column an aggregate function


class Action(enum.IntEnum):
    """What a write does to its key: the changelog rows it produces."""

    NONE = 0  # no change, no changelog row
    INSERT = 1  # +I new
    UPDATE = 2  # -U old, +U new
    DELETE = 3  # -D old


# Types a version column may have: ordered, and compared as integers.
def _is_version_type(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_timestamp(t) or pa.types.is_date(t)


@dataclass(frozen=True)
class MergeSpec:
    """The merge settings of a primary-key table, validated against its schema."""

    engine: MergeEngine = MergeEngine.LAST_ROW
    version_column: str | None = None
    upsert_key: tuple[str, ...] | None = None  # retract: what identifies a row in a key's list (None: all columns)
    state_ttl_ms: int | None = None  # retract: live rows older than this are dropped (but the visible one)
    aggregates: tuple[tuple[str, str], ...] = ()  # aggregation: (column, function) of every non-key column

    @classmethod
    def of(cls, schema: pa.Schema, primary_key: list[str], engine: str | None,
           version_column: str | None, *, upsert_key: list[str] | None = None, state_ttl_ms: str | int | None = None,
           aggregates: dict[str, str] | None = None) -> "MergeSpec":
        try:
            eng = MergeEngine((engine or "last_row").lower())
        except ValueError:
            raise InvalidConfigError(
                f"Unknown merge engine {engine!r}: must be one of {[e.value for e in MergeEngine]}") from None
        if eng is MergeEngine.VERSIONED:
            if not version_column:
                raise InvalidConfigError("merge engine 'versioned' needs a version column (fluvial.version.column)")
            if version_column not in schema.names:
                raise InvalidConfigError(f"version column {version_column!r} is not a column of the table")
            if not _is_version_type(schema.field(version_column).type):
                raise InvalidConfigError(f"version column {version_column!r} has type "
                                         f"{schema.field(version_column).type}; it must be an integer, timestamp or date")
            if version_column in primary_key:
                raise InvalidConfigError(f"version column {version_column!r} cannot be part of the primary key")
        elif version_column:
            raise InvalidConfigError(f"a version column is only used by merge engine 'versioned', not {eng.value!r}")
        if (upsert_key or state_ttl_ms not in (None, "")) and eng is not MergeEngine.RETRACT:
            raise InvalidConfigError(f"an upsert key and a state TTL are only used by merge engine 'retract', "
                                     f"not {eng.value!r}")
        if aggregates and eng is not MergeEngine.AGGREGATION:
            raise InvalidConfigError(f"aggregate functions (fluvial.agg.<column>) are only used by merge engine "
                                     f"'aggregation', not {eng.value!r}")
        ukey = None
        ttl = None
        if eng is MergeEngine.RETRACT:
            if upsert_key:
                unknown = [c for c in upsert_key if c not in schema.names]
                if unknown:
                    raise InvalidConfigError(f"upsert-key column(s) {unknown} are not columns of the table {schema.names}")
                ukey = tuple(dict.fromkeys(upsert_key))
            if state_ttl_ms not in (None, ""):
                try:
                    ttl = int(state_ttl_ms)
                except (TypeError, ValueError):
                    raise InvalidConfigError(f"Invalid state TTL {state_ttl_ms!r}: milliseconds expected") from None
                if ttl <= 0:
                    raise InvalidConfigError(f"Invalid state TTL {ttl}: it must be positive (leave it unset to keep "
                                             "every live row)")
        aggs: tuple[tuple[str, str], ...] = ()
        if eng is MergeEngine.AGGREGATION:
            from fluvial.kv.rowmerger.aggregate import check_aggregates
            aggs = check_aggregates(schema, primary_key, aggregates or {})
        return cls(eng, version_column or None, ukey, ttl, aggs)

    @property
    def keeps_state_rows(self) -> bool:
        """The engine keeps more per key than the visible row: written rows are logged."""
        return self.engine is MergeEngine.RETRACT

    def check_write(self, columns: list[str], *, deletes: bool, partial_columns: list[str] | None,
                    retractions: bool = False) -> None:
        """Refuse writes this engine cannot take (InvalidRecordError), before anything is applied."""
        if partial_columns is not None and self.engine is not MergeEngine.LAST_ROW:
            raise InvalidRecordError(f"partial updates are not supported by merge engine {self.engine.value!r} "
                                     "(only by the default 'last_row')")
        if (deletes or retractions) and partial_columns is not None:
            raise InvalidRecordError("a partial update cannot carry deletes; delete in a write of its own")
        if (deletes or retractions) and self.engine in (MergeEngine.FIRST_ROW, MergeEngine.VERSIONED):
            raise InvalidRecordError(f"deletes are not supported (nor retractions -U/-D) by merge engine "
                                     f"{self.engine.value!r}: it keeps the first or the highest-version row")
        if self.engine is MergeEngine.VERSIONED and self.version_column not in columns:
            raise InvalidRecordError(f"writes to a 'versioned' table must carry the version column "
                                     f"{self.version_column!r}")


class RowMerger:
    """Decides, for one round of writes (at most one per key), the action and the new row."""

    def merge(self, old: pa.StructArray, old_exists: np.ndarray, new: pa.StructArray,
              deletes: np.ndarray) -> np.ndarray:
        """Actions (int8, `Action`) for each write; the new row of an INSERT/UPDATE is `new`."""
        raise NotImplementedError


class LastRowMerger(RowMerger):
    """The latest write wins; a delete removes the row."""

    def merge(self, old, old_exists, new, deletes):
        return np.where(deletes, np.where(old_exists, Action.DELETE, Action.NONE),
                        np.where(old_exists, Action.UPDATE, Action.INSERT)).astype(np.int8)


class FirstRowMerger(RowMerger):
    """The first row of a key stays; later upserts change nothing."""

    def merge(self, old, old_exists, new, deletes):
        return np.where(old_exists, Action.NONE, Action.INSERT).astype(np.int8)


class VersionedMerger(RowMerger):
    """The row with the highest version stays; a stale version changes nothing."""

    def __init__(self, version_column: str):
        self.version_column = version_column

    def merge(self, old, old_exists, new, deletes):
        new_v = new.field(self.version_column)
        old_v = old.field(self.version_column)
        newer = pc.fill_null(pc.greater_equal(new_v, old_v), True).to_numpy(zero_copy_only=False)
        return np.where(old_exists, np.where(newer, Action.UPDATE, Action.NONE), Action.INSERT).astype(np.int8)


def merger_for(spec: MergeSpec) -> RowMerger:
    if spec.engine is MergeEngine.FIRST_ROW:
        return FirstRowMerger()
    if spec.engine is MergeEngine.VERSIONED:
        return VersionedMerger(spec.version_column)
    return LastRowMerger()
