"""The python examples of docs/client.md run as written, in order, against a broker."""
from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
DOC_URL = "grpc://127.0.0.1:8815"
BLOCK = re.compile(r"(<!-- not run:[^>]*-->\s*)?```python\n(.*?)```", re.S)


def examples(text: str) -> list[str]:
    """The python blocks of a guide, without those marked `<!-- not run: why -->`."""
    return [m.group(2) for m in BLOCK.finditer(text) if not m.group(1)]


def test_client_guide_examples_run(fresh_broker, capsys):
    blocks = examples(DOC.read_text())
    assert len(blocks) >= 8 and any("duckdb.sql" in b for b in blocks) and any("pc.field" in b for b in blocks)
    broker = fresh_broker()
    namespace: dict = {"__name__": "client_guide"}
    for i, code in enumerate(blocks):
        assert DOC_URL in code or i > 0, "the first example connects to the documented address"
        source = code.replace(DOC_URL, broker.flight_url)
        exec(compile(source, f"{DOC.name}:example{i + 1}", "exec"), namespace)  # noqa: S102 - the guide's own code
    printed = capsys.readouterr().out
    assert "FilterTypeError" in printed and "FilterColumnError" in printed  # the bad-filter example's output
    assert "Oslo" in printed                                                 # DuckDB's answer
