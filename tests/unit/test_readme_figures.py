"""The README's benchmark figures are the ones in benchmarks/results/, regenerated, never edited by hand."""
from benchmarks import readme_figures


def test_readme_figures_match_the_results():
    current = readme_figures.README.read_text()
    assert readme_figures.render(current) == current, (
        "README.md's benchmark block differs from benchmarks/results/: run `python -m benchmarks.readme_figures`")


def test_a_missing_result_is_shown_not_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(readme_figures, "RESULTS", tmp_path)
    block = readme_figures.block()
    assert "not measured" in block
    assert "No harness results yet" in block


# --- figures quoted in docs/*.md --------------------------------------------------------------

import json  # noqa: E402

import pytest  # noqa: E402

from benchmarks import doc_figures  # noqa: E402


def test_doc_figures_match_the_results():
    for doc in doc_figures.documents():
        current = doc.read_text()
        assert doc_figures.render(current) == current, (
            f"{doc.name}'s figures differ from benchmarks/results/: run `python -m benchmarks.doc_figures`")


def test_every_doc_figure_names_a_result_that_exists():
    for doc in doc_figures.documents():
        for marker in doc_figures.MARKER.finditer(doc.read_text()):
            assert doc_figures.resolve(marker["spec"]) != doc_figures.MISSING, (doc.name, marker["spec"])


def test_a_figure_marker_is_filled_scaled_reduced_and_formatted(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(
        {"a": {"bytes": 3577470, "runs": [{"load": 2.5}, {"load": 7.25}]}, "k with space": {"x": 3}}))
    text = ("<!-- fig r.json a.bytes /1e6 .2f -->?<!-- /fig --> MB, load "
            "<!-- fig r.json a.runs.*.load|max .1f -->?<!-- /fig -->, "
            "<!-- fig r.json 1.x -->?<!-- /fig -->, <!-- fig r.json a.gone -->9<!-- /fig -->, "
            "<!-- fig other.json a -->1<!-- /fig -->")
    assert doc_figures.render(text, tmp_path) == (
        "<!-- fig r.json a.bytes /1e6 .2f -->3.58<!-- /fig --> MB, load "
        "<!-- fig r.json a.runs.*.load|max .1f -->7.2<!-- /fig -->, "
        "<!-- fig r.json 1.x -->3<!-- /fig -->, <!-- fig r.json a.gone -->not measured<!-- /fig -->, "
        "<!-- fig other.json a -->not measured<!-- /fig -->")
    with pytest.raises(doc_figures.FigureError):
        doc_figures.render("<!-- fig r.json a -->?<!-- /fig -->", tmp_path)   # not a number
    with pytest.raises(doc_figures.FigureError):
        doc_figures.render("<!-- fig r.json a.bytes|mean -->?<!-- /fig -->", tmp_path)


def test_the_machine_line_names_each_machine_with_its_workloads():
    one = {"machine": {"cpu": "CPU A", "logical_cores": 2}}
    results = [{**one, "workload": "w1"}, {**one, "workload": "w2"},
               {"machine": {"cpu": "CPU B", "logical_cores": 2}, "workload": "w3"}]
    assert readme_figures._machines(results[:2]) == "Machine: CPU A, 2 cores"
    assert readme_figures._machines(results) == "Machines: CPU A, 2 cores (w1, w2); CPU B, 2 cores (w3)"
