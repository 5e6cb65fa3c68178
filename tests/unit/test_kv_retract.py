"""KV tablet, `retract` engine: the seed's join example in its three orderings, the list
rules, the state TTL and figures, recovery from the logged input rows."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.errors import InvalidConfigError, InvalidRecordError
from fluvial.kv import ChangeType, KeyLayout, KvTablet, MergeSpec
from fluvial.kv.change_types import FIRST_HIDDEN, parse_changes
from tests.support.changelog_join import materialized

# The seed's sink table t1: id BIGINT, level BIGINT, attr VARCHAR, PRIMARY KEY(id).
T1 = pa.schema([pa.field("id", pa.int64(), False), pa.field("level", pa.int64()), pa.field("attr", pa.string())])
CODE = {"+I": ChangeType.INSERT, "-U": ChangeType.UPDATE_BEFORE, "+U": ChangeType.UPDATE_AFTER,
        "-D": ChangeType.DELETE}
LABEL = {int(v): k for k, v in CODE.items()}

# The join's output for s1: +I(1,10), -U(1,10), +U(1,20) joined with s2 (10 -> a1, 20 -> b1).
I_A1 = ("+I", 1, 10, "a1")
U_A1 = ("-U", 1, 10, "a1")
U_B1 = ("+U", 1, 20, "b1")


def open_tablet(path, engine="retract", upsert_key=None, ttl=None):
    spec = MergeSpec.of(T1, ["id"], engine, None, upsert_key=upsert_key, state_ttl_ms=ttl)
    return KvTablet.open(path, T1, KeyLayout(T1, ["id"]), spec)


class Writer:
    """Writes changes one batch at a time, as the broker does (prepare, then apply)."""

    def __init__(self, tablet):
        self.tablet = tablet
        self.offset = 0
        self.log: list[pa.RecordBatch] = []  # the stored changelog, with offsets

    def write(self, changes, times=None):
        rows = pa.RecordBatch.from_pylist([{"id": i, "level": lv, "attr": a} for _, i, lv, a in changes], schema=T1)
        codes = parse_changes(pa.array([c[0] for c in changes]))
        w = self.tablet.prepare(rows, changes=codes, timestamps=times)
        m = w.changelog.num_rows
        batch = w.changelog.append_column("_offset", pa.array(np.arange(self.offset, self.offset + m, dtype=np.int64)))
        batch = batch.append_column("_timestamp", pa.array(
            np.zeros(m, np.int64) if times is None else np.asarray(times, np.int64)[w.changelog.column("_source")
                                                                                     .to_numpy()]))
        self.offset += m
        self.log.append(batch)
        self.tablet.apply(w, self.offset)
        return visible(w.changelog)


def visible(changelog: pa.RecordBatch) -> list[tuple]:
    out = []
    for r in changelog.to_pylist():
        if r["_change"] < FIRST_HIDDEN:
            out.append((LABEL[r["_change"]], r["id"], r["level"], r["attr"]))
    return out


def rows(tablet) -> list[tuple]:
    return sorted((r["id"], r["level"], r["attr"]) for b in tablet.scan() for r in b.to_pylist())


@pytest.mark.parametrize("batched", [False, True])
def test_seed_ordering_1_in_order(tmp_path, batched):
    w = Writer(open_tablet(tmp_path / "kv"))
    if batched:
        out = w.write([I_A1, U_A1, U_B1])
    else:
        out = w.write([I_A1]) + w.write([U_A1]) + w.write([U_B1])
    assert out == [("+I", 1, 10, "a1"), ("-D", 1, 10, "a1"), ("+I", 1, 20, "b1")]
    assert rows(w.tablet) == [(1, 20, "b1")]


@pytest.mark.parametrize("batched", [False, True])
def test_seed_ordering_2_removing_the_last_row_emits_the_one_before(tmp_path, batched):
    # +U(b1) arrives first, then +I(a1) and its -U(a1): removing the last row shows b1 again.
    w = Writer(open_tablet(tmp_path / "kv"))
    seq = [U_B1, I_A1, U_A1]
    out = w.write(seq) if batched else sum((w.write([c]) for c in seq), [])
    assert out == [("+I", 1, 20, "b1"), ("-U", 1, 20, "b1"), ("+U", 1, 10, "a1"),
                   ("-U", 1, 10, "a1"), ("+U", 1, 20, "b1")]
    assert rows(w.tablet) == [(1, 20, "b1")]


@pytest.mark.parametrize("batched", [False, True])
def test_seed_ordering_3_removing_an_earlier_row_emits_nothing(tmp_path, batched):
    w = Writer(open_tablet(tmp_path / "kv"))
    seq = [I_A1, U_B1, U_A1]
    out = w.write(seq) if batched else sum((w.write([c]) for c in seq), [])
    assert out == [("+I", 1, 10, "a1"), ("-U", 1, 10, "a1"), ("+U", 1, 20, "b1")]
    assert rows(w.tablet) == [(1, 20, "b1")]


def test_last_row_gets_the_seeds_wrong_result(tmp_path):
    # The same reordered changelog on a last-write-wins table deletes a row that should exist.
    w = Writer(open_tablet(tmp_path / "kv", engine="last_row"))
    for c in [I_A1, U_B1, U_A1]:
        w.write([c])
    assert rows(w.tablet) == []


def test_retracting_an_absent_row_emits_nothing_and_is_counted(tmp_path):
    t = open_tablet(tmp_path / "kv")
    w = Writer(t)
    assert w.write([("-U", 1, 10, "zz")]) == []
    w.write([I_A1])
    assert w.write([("-D", 1, 10, "other")]) == []
    assert t.retract_stats.retracts_absent == 2
    assert t.retract_stats.keys == 1 and t.retract_stats.rows == 1


def test_upsert_key_replaces_in_place(tmp_path):
    w = Writer(open_tablet(tmp_path / "kv", upsert_key=["level"]))
    assert w.write([("+I", 1, 10, "a1")]) == [("+I", 1, 10, "a1")]
    assert w.write([("+I", 1, 20, "b1")]) == [("-U", 1, 10, "a1"), ("+U", 1, 20, "b1")]
    # Same upsert key as the earlier row: replaced where it is, the visible row stays.
    assert w.write([("+U", 1, 10, "a2")]) == []
    # Same upsert key as the last row: the visible row changes.
    assert w.write([("+U", 1, 20, "b2")]) == [("-U", 1, 20, "b1"), ("+U", 1, 20, "b2")]
    # Retracting by upsert key (the other columns need not match).
    assert w.write([("-U", 1, 20, "whatever")]) == [("-U", 1, 20, "b2"), ("+U", 1, 10, "a2")]
    assert w.write([("-D", 1, 10, "a2")]) == [("-D", 1, 10, "a2")]
    assert rows(w.tablet) == []
    assert w.tablet.retract_stats.keys == 0 and w.tablet.retract_stats.rows == 0


def test_whole_row_identity_makes_a_repeated_add_idempotent(tmp_path):
    w = Writer(open_tablet(tmp_path / "kv"))
    w.write([I_A1])
    assert w.write([I_A1]) == []  # an at-least-once retry
    assert w.write([U_A1]) == [("-D", 1, 10, "a1")]


def test_tombstone_removes_the_key_with_its_list(tmp_path):
    t = open_tablet(tmp_path / "kv")
    w = Writer(t)
    w.write([I_A1, U_B1])
    keys = pa.RecordBatch.from_pylist([{"id": 1}], schema=pa.schema([T1.field("id")]))
    write = t.prepare(keys, deletes=np.array([True]))
    assert visible(write.changelog) == [("-D", 1, 20, "b1")]
    t.apply(write, 100)
    assert rows(t) == [] and t.retract_stats.rows == 0


def test_state_ttl_drops_old_earlier_rows_but_never_the_visible_one(tmp_path):
    t = open_tablet(tmp_path / "kv", ttl=1000)
    w = Writer(t)
    w.write([("+I", 1, 10, "a1")], times=[0])
    w.write([("+I", 1, 20, "b1")], times=[500])
    w.write([("+I", 1, 30, "c1")], times=[5000])  # a1 and b1 are older than 1 s: dropped
    assert t.retract_stats.rows == 1 and t.retract_stats.rows_expired == 2
    # Retracting the visible row now leaves nothing (the expired rows are gone).
    assert w.write([("-U", 1, 30, "c1")], times=[5001]) == [("-D", 1, 30, "c1")]
    assert w.write([("-U", 1, 10, "a1")], times=[5002]) == []
    assert t.retract_stats.retracts_absent == 1


def test_state_and_figures_recover_from_the_logged_inputs(tmp_path):
    t = open_tablet(tmp_path / "kv", upsert_key=["level"])
    w = Writer(t)
    w.write([U_B1, I_A1])
    w.write([("+I", 2, 5, "x"), ("+I", 2, 6, "y"), ("-U", 2, 5, "x")])
    w.write([U_A1])
    expected_rows, expected_stats = rows(t), t.retract_stats.to_json()
    t.close()
    fresh = open_tablet(tmp_path / "fresh", upsert_key=["level"])
    fresh.replay(w.log)
    assert rows(fresh) == expected_rows
    assert fresh.retract_stats.to_json() == expected_stats
    # The lists came back too: retracting b1 now shows nothing for key 1, and y stays for 2.
    after = Writer(fresh)
    after.offset = w.offset
    assert after.write([("-U", 1, 20, "b1")]) == [("-D", 1, 20, "b1")]
    assert rows(fresh) == [(2, 6, "y")]


def test_invalid_change_types_are_refused_per_record():
    with pytest.raises(InvalidRecordError) as e:
        parse_changes(pa.array(["+I", "-X", "+U", None]))
    assert [i for i, _ in e.value.record_errors] == [1, 3]
    assert "'-X'" in str(e.value)
    with pytest.raises(InvalidRecordError):
        parse_changes(pa.array([1, 9], pa.int8()))


def test_retract_settings_are_checked():
    with pytest.raises(InvalidConfigError, match="upsert-key"):
        MergeSpec.of(T1, ["id"], "retract", None, upsert_key=["nope"])
    with pytest.raises(InvalidConfigError, match="TTL"):
        MergeSpec.of(T1, ["id"], "retract", None, state_ttl_ms="-5")
    with pytest.raises(InvalidConfigError, match="only used by merge engine 'retract'"):
        MergeSpec.of(T1, ["id"], "last_row", None, upsert_key=["level"])


changes_st = st.lists(st.tuples(st.sampled_from(["+I", "-U", "+U", "-D"]), st.integers(1, 3), st.integers(0, 3),
                                st.sampled_from(["a", "b"])), min_size=1, max_size=40)


@pytest.mark.parametrize("upsert_key", [None, ("level",)])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=changes_st, cuts=st.lists(st.integers(0, 40), max_size=6))
def test_any_batching_follows_the_list_model(tmp_path_factory, upsert_key, changes, cuts):
    # Keys written once in a batch are merged column-wise, the others row by row: any split
    # of the same changes into batches gives the model's rows and changelog.
    t = open_tablet(tmp_path_factory.mktemp("kv") / "kv", upsert_key=list(upsert_key) if upsert_key else None)
    w = Writer(t)
    bounds = sorted({0, len(changes), *[c for c in cuts if c < len(changes)]})
    emitted = []
    for lo, hi in zip(bounds, bounds[1:]):
        emitted += w.write(changes[lo:hi])
    index = None if upsert_key is None else [1]  # the model's row is (id, level, attr)
    rows_model, emitted_model = materialized(changes, index)
    assert emitted == emitted_model
    assert rows(t) == sorted(rows_model.values())
    assert t.retract_stats.keys == len(rows_model)
    assert sum(t.retract_stats.histogram) == len(rows_model)


def test_readers_hide_exactly_the_logged_input_rows():
    from fluvial.client.predicates import FIRST_STATE_CHANGE, hide_state_rows
    assert FIRST_STATE_CHANGE == FIRST_HIDDEN == ChangeType.INPUT_ADD
    batch = pa.RecordBatch.from_pydict({"_change": pa.array([5, 1, 6, 2, 3, 7, 4], pa.int8()),
                                        "id": list(range(7))})
    assert hide_state_rows(batch).column("id").to_pylist() == [1, 3, 4, 6]
    assert hide_state_rows(batch.select(["id"])).num_rows == 7  # no `_change`: a log table's batch
