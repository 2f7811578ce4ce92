"""The docs stay true to the repository: the README is a first page (short, linking every page under
docs/), every relative link and anchor resolves, and the README still holds the test command that
.ci/run runs verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return re.sub(r"`[^`]*`", "", "\n".join(out))  # a code span may run over a line break


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, -1, -2 on repeats."""
    found: set[str] = set()
    count: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        fenced ^= line.lstrip().startswith("```")
        heading = None if fenced else re.match(r"#{1,6} (.+)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            n = count.get(slug, 0)
            found.add(slug if n == 0 else f"{slug}-{n}")
            count[slug] = n + 1
    return found


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text(encoding="utf-8"))) if not re.match(r"[a-z]+:", t)]


def test_the_readme_is_a_first_page() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 150


def test_every_page_under_docs_is_linked_from_the_readme() -> None:
    linked = {(ROOT / t.split("#")[0]).resolve() for t in relative_links(README) if t.split("#")[0]}
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert page.resolve() in linked, f"{page.relative_to(ROOT)} is not linked from README.md"
    assert (ROOT / "docs" / "screenshot.svg").resolve() in linked


def test_every_relative_link_and_anchor_resolves() -> None:
    for page in PAGES:
        for target in relative_links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            assert dest.exists(), f"{page.relative_to(ROOT)}: {target} does not exist"
            if anchor:
                assert anchor in anchors(dest), (
                    f"{page.relative_to(ROOT)}: no heading for #{anchor} in {file or page.name}"
                )


def test_the_readme_holds_the_test_command_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    marker = next(i for i, line in enumerate(ci) if "the README's test command, verbatim" in line)
    command = ci[marker + 1].strip()
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n## Test\n") : text.index("\n## ", text.index("\n## Test\n") + 1)]
    assert f"```\n{command}\n```" in section
