"""Every relative link in README.md and docs/**/*.md points at a file that exists (and, with a
#fragment into a Markdown file, at a heading that exists there), so moving or renaming a page
cannot silently break the documentation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The Markdown without fenced code blocks and inline code (links there are not links)."""
    return _CODE.sub("", _FENCE.sub("", text))


def links(path: Path) -> list[str]:
    """Relative link targets of one Markdown file (web, mail and same-page links left out)."""
    out = []
    for target in _LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue
        out.append(target)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in _HEADING.findall(_prose(path.read_text(encoding="utf-8")))}


def test_slug_follows_githubs_rule():
    # Expected anchors as GitHub renders them for these headings.
    assert slug("Late injection: speed and Avg Gap") == "late-injection-speed-and-avg-gap"
    assert slug("The two commands") == "the-two-commands"
    assert slug("Profiles (`--profile`) and training options") == "profiles---profile-and-training-options"


def test_the_checker_sees_links_and_skips_code(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("See [a](a.md) and ![b](img/b.png), [web](https://x.org), [here](#top).\n"
                    "`[no](inline.md)`\n```\n[no](fenced.md)\n```\n", encoding="utf-8")
    assert links(page) == ["a.md", "img/b.png"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    broken = []
    for target in links(doc):
        file_part, _, fragment = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading #{fragment} in {dest.name})")
    assert not broken, f"{doc.relative_to(ROOT)} has broken links: {broken}"


def test_readme_is_one_page():
    words = len((ROOT / "README.md").read_text(encoding="utf-8").split())  # as `wc -w` counts, code included
    assert words < 1000, f"README.md has {words} words; keep it under 1,000 (details go to docs/)"
