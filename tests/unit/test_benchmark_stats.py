"""The benchmark harness's statistics: medians over counted rounds and Fluvial/Kafka ratios per round pair."""

from __future__ import annotations

import json

import pytest

from benchmarks import report, stats
from benchmarks.brokers import ALL_SYSTEMS, KAFKA, random_cluster_id
from benchmarks.runner import Failure, WorkloadResult, round_order
from benchmarks.workloads import RECORDS_PER_S, Case, Scale, Workload


def test_summary_is_median_and_range_of_counted_rounds() -> None:
    by_round = {0: 1.0, 1: 10.0, 2: 30.0, 3: 20.0}
    kept = stats.counted(by_round, warmup_rounds=1)
    assert kept == {1: 10.0, 2: 30.0, 3: 20.0}
    assert stats.summarize(list(kept.values())) == stats.Summary(median=20.0, min=10.0, max=30.0, n=3)
    assert stats.summarize([]) is None


def test_ratio_pairs_rounds_and_skips_rounds_missing_on_either_side() -> None:
    fluvial = {1: 50.0, 2: 80.0, 3: 30.0}
    kafka = {1: 100.0, 2: 100.0, 4: 100.0}
    assert stats.paired_ratios(fluvial, kafka) == [0.5, 0.8]
    assert stats.ratio_summary(fluvial, kafka) == stats.Summary(median=0.65, min=0.5, max=0.8, n=2)
    assert stats.ratio_summary({1: 5.0}, {}) is None


def test_ratio_of_pairs_differs_from_ratio_of_medians() -> None:
    # Machine drift between rounds cancels within a pair: both systems fast in round 1, slow in 2 and 3.
    fluvial = {1: 200.0, 2: 60.0, 3: 40.0}
    kafka = {1: 100.0, 2: 30.0, 3: 20.0}
    assert stats.ratio_summary(fluvial, kafka).median == pytest.approx(2.0)
    assert stats.ratio_summary(fluvial, kafka).min == pytest.approx(2.0)


@pytest.mark.parametrize(("value", "text"), [(123456.7, "123,457"), (512.3, "512"), (42.26, "42.3"),
                                             (3.14159, "3.14"), (0.012345, "0.0123"), (0, "0")])
def test_format_value_keeps_three_significant_figures(value: float, text: str) -> None:
    assert stats.format_value(value) == text


def test_round_order_alternates() -> None:
    assert [s.name for s in round_order(ALL_SYSTEMS, 0)] == ["kafka", "fluvial", "fluvial-flush-none"]
    assert [s.name for s in round_order(ALL_SYSTEMS, 1)] == ["fluvial-flush-none", "fluvial", "kafka"]


def test_cluster_id_is_kafka_uuid_text() -> None:
    cluster_id = random_cluster_id()
    assert len(cluster_id) == 22 and not cluster_id.startswith("-")


def _result() -> WorkloadResult:
    workload = Workload(name="demo", description="demo workload", metrics=(RECORDS_PER_S,),
                        cases=lambda scale: [Case("client, 100 B", lambda b, p: {})])
    result = WorkloadResult(workload=workload, scale=Scale(quick=False), systems=ALL_SYSTEMS, rounds=3,
                            warmup_rounds=1, command="python -m benchmarks run demo",
                            machine={"cpu": "x", "logical_cores": 2, "memory_gb": 1, "os": "Linux", "python": "3",
                                     "java": "17", "confluent_kafka": "2", "librdkafka": "2",
                                     "apache_kafka": "4", "git_commit": "abc"})
    for round_no, (k, f) in enumerate([(1.0, 1.0), (100.0, 50.0), (200.0, 300.0)]):
        result.record("client, 100 B", "kafka", round_no, {"records/s": k})
        result.record("client, 100 B", "fluvial", round_no, {"records/s": f})
    result.failures.append(Failure("fluvial-flush-none", "client, 100 B", 0, "CaseFailed: boom\ntrace"))
    return result


def test_workload_json_has_counted_summaries_and_ratios() -> None:
    data = json.loads(json.dumps(_result().to_json()))
    (metric,) = data["cases"][0]["metrics"]
    assert metric["systems"]["kafka"]["summary"] == {"median": 150.0, "min": 100.0, "max": 200.0, "n": 2}
    assert metric["systems"]["kafka"]["rounds"]["0"] == 1.0  # warm-up kept in the raw data
    assert metric["ratio_to_kafka"]["fluvial"] == {"median": 1.0, "min": 0.5, "max": 1.5, "n": 2}
    assert metric["systems"]["fluvial-flush-none"]["summary"] is None
    assert metric["ratio_to_kafka"]["fluvial-flush-none"] is None
    # Every counted round pair's own ratio (the warm-up round 0 left out), the worst among them.
    assert metric["ratio_to_kafka_by_round"]["fluvial"] == {"1": 0.5, "2": 1.5}
    assert metric["ratio_to_kafka_by_round"]["fluvial-flush-none"] == {}
    assert [s["name"] for s in data["systems"]] == [s.name for s in ALL_SYSTEMS]
    assert data["systems"][0]["durability"] == KAFKA.durability


def test_markdown_and_chart_from_results(tmp_path) -> None:
    report.write_workload_json(tmp_path, _result().to_json())
    (tmp_path / "unrelated.json").write_text('{"benchmark": "other"}')
    results = report.load_results(tmp_path)
    assert [r["workload"] for r in results] == ["demo"]
    text = report.markdown(results)
    assert "| client, 100 B | records/s ↑ | 150 (100–200) | 175 (50.0–300) | failed | 1.00× (0.50–1.50) | – |" in text
    assert "`fluvial-flush-none` — client, 100 B (round 1): CaseFailed: boom" in text
    png = report.write_chart(tmp_path, results)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
