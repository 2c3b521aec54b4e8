"""README.md, docs/*.md and benchmarks/RESULTS.md link only to pages (and
headings) that exist, and every docs page can be reached from README.md by
following links."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def links(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, anchor = target.partition("#")
    return ((page.parent / path).resolve() if path else page), anchor


def test_the_slug_rule() -> None:
    assert slug("Erasure and retention") == "erasure-and-retention"
    assert slug("Integrations: MCP, export and import") == "integrations-mcp-export-and-import"
    assert slug("Fusion, its defaults, and the `sensitivity` ceiling") == (
        "fusion-its-defaults-and-the-sensitivity-ceiling"
    )


def test_every_relative_link_resolves() -> None:
    dead = []
    for page in [*pages(), ROOT / "benchmarks" / "RESULTS.md"]:
        for target in links(page):
            path, anchor = resolve(page, target)
            if not path.exists():
                dead.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                dead.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert dead == []


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.exists():
            continue
        seen.add(page)
        todo.extend(resolve(page, t)[0] for t in links(page))
    unreachable = [p.relative_to(ROOT).as_posix() for p in pages() if p not in seen]
    assert unreachable == []
