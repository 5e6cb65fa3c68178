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
