"""Fills the benchmark figures quoted in docs/*.md from `benchmarks/results/` (never by hand).

    python -m benchmarks.doc_figures          # rewrite every figure marker in docs/*.md
    python -m benchmarks.doc_figures --check  # exit 1 if a doc differs from the results

A figure in a doc is an HTML comment naming where it comes from, followed by the value and a
closing comment; Markdown renders only the value:

    <!-- fig remote_layout.json stores.local.ratio .3f -->0.106<!-- /fig -->

The comment holds the results file, a dotted path into its JSON (numbers index lists, and
dicts by position where a key is not a number, `*`
takes every element, a trailing `|min`, `|max`, `|median` or `|count` reduces those), and
optional steps: `/N` or `*N` scale the value, anything else is a Python format spec (default:
thousands separators, one decimal for fractions). A figure whose result is missing reads
"not measured", so a deleted or renamed result shows in the doc instead of a stale number.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
MISSING = "not measured"

MARKER = re.compile(r"<!-- fig (?P<spec>[^>]*?) -->(?P<value>.*?)<!-- /fig -->", re.S)
_REDUCERS = {"min": min, "max": max, "median": statistics.median, "count": len}


class FigureError(ValueError):
    """A marker that cannot be read (as opposed to a result that is missing)."""


def _walk(data: Any, parts: list[str]) -> Any:
    if not parts:
        return data
    head, rest = parts[0], parts[1:]
    if head == "*":
        items = data.values() if isinstance(data, dict) else data if isinstance(data, list) else []
        values = [_walk(item, rest) for item in items]
        return [v for v in values if v is not None]
    if isinstance(data, dict):
        if head in data:
            return _walk(data[head], rest)
        # A key with spaces cannot be named in a marker: a number picks the n-th entry.
        if re.fullmatch(r"\d+", head) and int(head) < len(data):
            return _walk(list(data.values())[int(head)], rest)
        return None
    if isinstance(data, list) and re.fullmatch(r"-?\d+", head):
        index = int(head)
        return _walk(data[index], rest) if -len(data) <= index < len(data) else None
    return None


def _flatten(value: Any) -> list:
    if isinstance(value, list):
        return [x for v in value for x in _flatten(v)]
    return [value]


def resolve(spec: str, results: Path = RESULTS) -> str:
    """The text a marker with `spec` stands for."""
    tokens = spec.split()
    if len(tokens) < 2:
        raise FigureError(f"figure marker {spec!r} needs a results file and a path")
    name, path, steps = tokens[0], tokens[1], tokens[2:]
    reducer = None
    if "|" in path:
        path, reducer = path.split("|", 1)
        if reducer not in _REDUCERS:
            raise FigureError(f"figure marker {spec!r}: unknown reduction {reducer!r}")
    try:
        data = json.loads((results / name).read_text())
    except (OSError, json.JSONDecodeError):
        return MISSING
    value = _walk(data, path.split("."))
    if reducer is not None:
        values = [v for v in _flatten(value) if v is not None] if value is not None else []
        if not values:
            return MISSING
        value = _REDUCERS[reducer](values)
    if value is None or value == []:
        return MISSING
    fmt = None
    for step in steps:
        if step[0] in "/*" and len(step) > 1:
            try:
                factor = float(step[1:])
            except ValueError:
                raise FigureError(f"figure marker {spec!r}: bad scale {step!r}") from None
            value = value / factor if step[0] == "/" else value * factor
        else:
            fmt = step
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FigureError(f"figure marker {spec!r}: {name} holds {type(value).__name__} at {path}, not a number")
    if fmt is None:
        fmt = "," if float(value).is_integer() else ",.1f"
    try:
        return format(value, fmt)
    except ValueError:
        raise FigureError(f"figure marker {spec!r}: bad format {fmt!r}") from None


def render(text: str, results: Path = RESULTS) -> str:
    """`text` with every figure marker's value replaced by what the results say."""
    return MARKER.sub(lambda m: f"<!-- fig {m['spec']} -->{resolve(m['spec'], results)}<!-- /fig -->", text)


def documents() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a doc differs from the results")
    args = parser.parse_args(argv)
    stale = []
    for doc in documents():
        current = doc.read_text()
        wanted = render(current)
        if wanted != current:
            stale.append(doc)
            if not args.check:
                doc.write_text(wanted)
    if args.check and stale:
        print("figures differ from benchmarks/results/ in: " + ", ".join(str(d.relative_to(ROOT)) for d in stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
