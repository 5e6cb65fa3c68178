"""The code blocks of a guide in docs/, so that tests can run them as written."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
SECURITY_GUIDE = DOCS / "security.md"
# A fenced block, optionally preceded by a marker comment such as `<!-- run as shell -->`.
BLOCK = re.compile(r"(?:<!-- (?P<mark>[^>]*?) -->\s*)?```(?P<lang>\w+)\n(?P<code>.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    mark: str
    lang: str
    code: str


def blocks(text: str) -> list[Block]:
    return [Block(m.group("mark") or "", m.group("lang"), m.group("code")) for m in BLOCK.finditer(text)]


def guide_block(mark: str, doc: Path = SECURITY_GUIDE) -> str:
    """The one block of the guide carrying `<!-- mark -->`."""
    found = [b.code for b in blocks(doc.read_text()) if b.mark == mark]
    assert len(found) == 1, f"{doc.name} has {len(found)} blocks marked {mark!r}"
    return found[0]
