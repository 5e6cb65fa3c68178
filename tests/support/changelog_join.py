"""Reference changelogs for the `retract` engine's tests: the seed's join (s1 JOIN s2 ON
s1.level = s2.id) computed sequentially, split across writers as a shuffle by `level`
does, and plain models of what a table keyed by `id` should hold."""
from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pyarrow as pa

T1 = pa.schema([pa.field("id", pa.int64(), False), pa.field("level", pa.int64()), pa.field("attr", pa.string())])
T1_AVRO = {"type": "record", "name": "t1", "fields": [
    {"name": "id", "type": "long"}, {"name": "level", "type": ["null", "long"], "default": None},
    {"name": "attr", "type": ["null", "string"], "default": None}]}
T1_CONFIGS = {"fluvial.value.format": "avro", "fluvial.value.schema": json.dumps(T1_AVRO),
              "fluvial.primary.key": "id"}

Change = tuple[str, int, int, str]  # (change type, id, level, attr)


@dataclass
class JoinInputs:
    """s1 changes (id -> level; None deletes) and s2 changes (level -> attr; None deletes), in order."""

    steps: list[tuple[str, int, int | None]]  # ("s1", id, level) | ("s2", level, attr index)


def sequential_join(steps) -> list[Change]:
    """The inner join's changelog in sequential processing (one task, no reordering)."""
    s1: dict[int, int] = {}
    s2: dict[int, str] = {}
    out: list[Change] = []
    for side, key, value in steps:
        if side == "s1":
            old = s1.get(key)
            old_row = (key, old, s2[old]) if old is not None and old in s2 else None
            if value is None:
                s1.pop(key, None)
            else:
                s1[key] = value
            new_row = (key, value, s2[value]) if value is not None and value in s2 else None
        else:
            attr = None if value is None else f"a{value}"
            affected = sorted(i for i, lv in s1.items() if lv == key)
            olds = [(i, key, s2[key]) for i in affected] if key in s2 else []
            if attr is None:
                s2.pop(key, None)
            else:
                s2[key] = attr
            news = [(i, key, attr) for i in affected] if attr is not None else []
            for i in affected:
                o = next((r for r in olds if r[0] == i), None)
                n = next((r for r in news if r[0] == i), None)
                out += _emit(o, n)
            continue
        out += _emit(old_row, new_row)
    return out


def _emit(old, new) -> list[Change]:
    if old is None and new is None or old == new:
        return []
    if old is None:
        return [("+I", *new)]
    if new is None:
        return [("-D", *old)]
    return [("-U", *old), ("+U", *new)]


def split_by_level(changes: list[Change], writers: int) -> list[list[Change]]:
    """What each of `writers` parallel join tasks emits when rows are shuffled by `level`:
    every row's ADD and RETRACT go to the same task, in order."""
    parts: list[list[Change]] = [[] for _ in range(writers)]
    for c in changes:
        parts[c[2] % writers].append(c)
    return parts


def interleave(parts: list[list[Change]], rnd: random.Random) -> list[tuple[int, Change]]:
    """One arrival order at the sink: each writer's order kept, writers interleaved at random."""
    pos = [0] * len(parts)
    out = []
    while True:
        live = [w for w in range(len(parts)) if pos[w] < len(parts[w])]
        if not live:
            return out
        w = rnd.choice(live)
        out.append((w, parts[w][pos[w]]))
        pos[w] += 1


def upsert_table(changes) -> dict[int, tuple]:
    """A table keyed by id after applying a changelog in order, last write wins (what a
    plain upsert sink does): -U and -D delete the key."""
    out: dict[int, tuple] = {}
    for kind, i, level, attr in changes:
        if kind in ("+I", "+U"):
            out[i] = (i, level, attr)
        else:
            out.pop(i, None)
    return out


def materialized(changes, upsert_key=None) -> tuple[dict[int, tuple], list[Change]]:
    """The retract engine's model: per id the list of live rows; returns the visible rows
    and the changelog it emits (as the broker documents it)."""
    lists: dict[int, list[tuple]] = {}
    emitted: list[Change] = []
    for kind, i, level, attr in changes:
        row = (i, level, attr)
        ident = row if upsert_key is None else tuple(row[c] for c in upsert_key)
        st = lists.setdefault(i, [])
        before = st[-1] if st else None
        idx = next((j for j, r in enumerate(st) if (r if upsert_key is None else tuple(r[c] for c in upsert_key))
                    == ident), None)
        if kind in ("+I", "+U"):
            if idx is None:
                st.append(row)
            else:
                st[idx] = row
        elif idx is not None:
            del st[idx]
        after = st[-1] if st else None
        if before is None and after is not None:
            emitted.append(("+I", *after))
        elif before is not None and after is None:
            emitted.append(("-D", *before))
        elif before is not None and after != before:
            emitted += [("-U", *before), ("+U", *after)]
    return {i: st[-1] for i, st in lists.items() if st}, emitted
