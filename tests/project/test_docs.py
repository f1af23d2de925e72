"""docs/algorithms.md is the project's own reference: code cites it, never documents outside the repo.

- No file of the repository cites the design notes that live outside it (names in OUTSIDE_DOCS).
- Every `docs/algorithms.md#<anchor>` (or `docs/internals.md#<anchor>`) and `docs/algorithms.md §<N>`
  cited anywhere exists.
- No citation says "sec. N": a section is "docs/algorithms.md §N" or "<paper> §N" (PPO paper §5.3.1),
  so the reader knows which document it means.
- Every `field: value` that the presets' sources list of the doc names is what the preset sets.
- Every relative link of README.md and the docs/, bench/ and examples/ pages resolves, heading included;
  README.md stays a front door: at most 10 KB, opening with `make demo` and `make test`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from rlhf.config import PRESETS, preset_dict

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "algorithms.md"
SCANNED = ("rlhf", "tests", "bench", "examples", "docs", "README.md")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg"}

# Written as stems so that this file does not cite them itself.
OUTSIDE_DOCS = tuple(f"{stem}.md" for stem in ("ALGORITHMS", "DESIGN", "PEERS"))
OUTSIDE_PATTERN = re.compile("|".join(re.escape(name) for name in OUTSIDE_DOCS))

# Files allowed to cite the outside notes (none: every citation points into the repository).
ALLOWED_OUTSIDE_CITATIONS: set[str] = set()

ANCHOR_CITATION = re.compile(r"docs/(algorithms|internals)\.md#([A-Za-z0-9_-]+)")
# "docs/algorithms.md §27", "§27-30", "§7 and §9", "§6, §8, §11", "§25, point 7" (and the old
# "docs/algorithms.md, sec. N" form, which UNLABELLED_SECTION below refuses, so that it is still checked).
SECTION_CITATION = re.compile(
    r"algorithms\.md,? (?:sec\. |§)(\d+(?:(?:\s*-\s*|, §| and §)\d+)*)(?:, points? (\d+)(?: and (\d+))?)?"
)
# "sec. 5.3.1" names no document: the PPO paper's section or this repository's docs/algorithms.md's?
UNLABELLED_SECTION = re.compile(r"\b[Ss]ec\.\s*\d")
# Paths (prefixes) still being relabelled by another change: remove each once it lands.
UNLABELLED_PENDING: tuple[str, ...] = ()


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """Headings (any level) outside fenced code blocks."""
    found, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            found.append(line.lstrip("#").strip())
    return found


def numbered_sections(markdown: str) -> dict[int, str]:
    """`## N. Title` headings by number."""
    return {int(m[1]): m[2] for h in headings(markdown) if (m := re.match(r"(\d+)\. (.+)", h))}


def section_text(markdown: str, number: int) -> str:
    """The body of `## number. ...` up to the next level-2 heading."""
    match = re.search(rf"^## {number}\. .*?$(.*?)(?=^## |\Z)", markdown, flags=re.M | re.S)
    assert match, f"docs/algorithms.md has no section {number}"
    return match[1]


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for file in candidates:
            if file.is_file() and file.suffix in TEXT_SUFFIXES and ".venv" not in file.parts:
                files.append(file)
    return files


def citations(pattern: re.Pattern) -> list[tuple[str, int, re.Match]]:
    """(relative path, line number, match) of every occurrence of `pattern` in the scanned files."""
    out = []
    for file in scanned_files():
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            out.extend((str(file.relative_to(ROOT)), number, m) for m in pattern.finditer(line))
    return out


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_github_anchor_matches_githubs_rule():
    assert github_anchor("8. Token-level reward") == "8-token-level-reward"
    assert github_anchor("12. PPO clipped loss") == "12-ppo-clipped-loss"
    assert github_anchor("Rewards (raw, clipped): k1/k2") == "rewards-raw-clipped-k1k2"


def test_sections_are_numbered_one_to_n_in_order(doc):
    numbers = [int(m[1]) for h in headings(doc) if (m := re.match(r"(\d+)\. ", h))]
    assert numbers == list(range(1, len(numbers) + 1)), f"section numbers {numbers}"


def test_no_file_cites_the_design_notes_outside_the_repository():
    offending = sorted(
        f"{path}:{line}"
        for path, line, _ in citations(OUTSIDE_PATTERN)
        if path not in ALLOWED_OUTSIDE_CITATIONS
    )
    assert not offending, (
        f"these lines cite {', '.join(OUTSIDE_DOCS)}, which are not in the repository; cite "
        "docs/algorithms.md (its anchor or '§N') or the paper section instead:\n" + "\n".join(offending)
    )


def test_the_allowed_files_still_need_their_exception():
    citing = {path for path, _, _ in citations(OUTSIDE_PATTERN)}
    stale = sorted(ALLOWED_OUTSIDE_CITATIONS - citing)
    assert not stale, f"{stale} no longer cite the outside notes: remove them from ALLOWED_OUTSIDE_CITATIONS"


def test_every_cited_anchor_is_a_heading():
    anchors = {
        name: {github_anchor(h) for h in headings((ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8"))}
        for name in ("algorithms", "internals")
    }
    found = citations(ANCHOR_CITATION)
    assert len(found) >= 5, "expected the code to cite docs/algorithms.md anchors; is the pattern right?"
    missing = sorted(
        f"{path}:{line}: docs/{m[1]}.md#{m[2]}" for path, line, m in found if m[2] not in anchors[m[1]]
    )
    assert not missing, "cited anchors with no heading in their doc:\n" + "\n".join(missing)


def test_every_cited_section_number_exists(doc):
    sections = numbered_sections(doc)
    found = citations(SECTION_CITATION)
    assert len(found) >= 5, "expected the code to cite docs/algorithms.md sections; is the pattern right?"
    missing = []
    for path, line, m in found:
        numbers = [int(n) for n in re.findall(r"\d+", m[1])]
        for number in numbers:
            if number not in sections:
                missing.append(f"{path}:{line}: §{number}")
        for point in (m[2], m[3]):
            if point is not None:
                points = re.findall(r"^(\d+)\. ", section_text(doc, numbers[0]), flags=re.M)
                if point not in points:
                    missing.append(f"{path}:{line}: §{numbers[0]}, point {point}")
    assert not missing, "cited sections or points not in docs/algorithms.md:\n" + "\n".join(missing)


def test_section_citations_are_read_as_lists_and_ranges():
    cited = [
        (m[1], m[2], m[3])
        for m in SECTION_CITATION.finditer(
            "docs/algorithms.md §27-30; docs/algorithms.md §7 and §9; docs/algorithms.md §6, §8, §11; "
            "docs/algorithms.md §25, points 7 and 8; docs/algorithms.md, sec. 23"
        )
    ]
    assert cited == [("27-30", None, None), ("7 and §9", None, None), ("6, §8, §11", None, None)] + [
        ("25", "7", "8"),
        ("23", None, None),
    ]


def test_every_section_citation_names_its_document():
    offending = sorted(
        f"{path}:{line}: {m[0]}"
        for path, line, m in citations(UNLABELLED_SECTION)
        if not path.startswith(UNLABELLED_PENDING)
        and path != "tests/project/test_docs.py"  # its own examples
    )
    assert not offending, (
        "these lines cite a section as 'sec. N', which does not say which document: write "
        "'docs/algorithms.md §N' for this repository's page, '<paper> §N' for a paper's "
        "(PPO paper §5.3.1, APA paper §3.3):\n" + "\n".join(offending)
    )


def test_the_pending_relabelling_is_still_pending():
    pending = {
        prefix
        for path, _, _ in citations(UNLABELLED_SECTION)
        for prefix in UNLABELLED_PENDING
        if path.startswith(prefix)
    }
    done = sorted(set(UNLABELLED_PENDING) - pending)
    assert not done, f"{done} no longer say 'sec. N': remove them from UNLABELLED_PENDING"


def presets_section(doc: str) -> str:
    number = next(n for n, title in numbered_sections(doc).items() if title == "Presets")
    return section_text(doc, number)


MISSING = object()


def lookup(tree: dict, dotted: str):
    """`tree["a"]["b"]` for "a.b", or MISSING."""
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return MISSING
        tree = tree[part]
    return tree


LINKED_PAGES = ("README.md", "docs", "bench", "examples")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_of_the_pages_resolves():
    """README.md and the docs/, bench/ and examples/ pages link to files that exist, at their headings."""
    pages = [ROOT / "README.md"] + [
        page for name in LINKED_PAGES[1:] for page in sorted((ROOT / name).rglob("*.md"))
    ]
    broken, checked = [], 0
    for page in pages:
        for m in MARKDOWN_LINK.finditer(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", m[1]):
                continue
            path, _, fragment = m[1].partition("#")
            target = (page.parent / path) if path else page
            checked += 1
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {m[1]} (no such file)")
            elif fragment and target.suffix == ".md":
                if fragment not in {github_anchor(h) for h in headings(target.read_text(encoding="utf-8"))}:
                    broken.append(f"{page.relative_to(ROOT)}: {m[1]} (no such heading)")
    assert checked >= 20, "expected the pages to link to each other; is the pattern right?"
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_a_front_door():
    """At most 10 KB, and its first lines are the two commands (reference material lives in docs/)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode("utf-8")) <= 10_000, (
        f"README.md is {len(readme.encode())} bytes: move reference material to docs/"
    )
    lines = readme.splitlines()
    assert lines[2].split("#")[0].strip() == "make demo" and lines[3].split("#")[0].strip() == "make test"


def test_readme_points_to_the_doc_from_presets_and_switches():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Presets and switches$(.*?)(?=^## )", readme, flags=re.M | re.S)
    assert section and "docs/algorithms.md" in section[1]


PRESET_BULLET = re.compile(r"^- ((?:`\w+`(?:, )?)+) ", flags=re.M)
NAMED_VALUE = re.compile(r"`([a-z_]+(?:\.[a-z_]+)+): ([^`]+)`")


def sources_bullets(doc: str) -> dict[str, list[str]]:
    """{bullet text: presets it names} of the "Sources of every preset value" list of the Presets section."""
    section = presets_section(doc).split("### Sources of every preset value", 1)[1]
    starts = list(PRESET_BULLET.finditer(section))
    out = {}
    for here, after in zip(starts, [*starts[1:], None]):
        text = section[here.start() : after.start() if after else len(section)].split("\n\n")[0]
        out[text] = re.findall(r"`(\w+)`", here[1])
    return out


def test_every_preset_has_its_sources_and_each_named_value_is_the_presets(doc):
    """Each preset has a sources bullet; every `field: value` it names is what the preset sets."""
    bullets = sources_bullets(doc)
    named = [name for names in bullets.values() for name in names]
    assert sorted(named) == sorted(PRESETS), f"sources bullets name {named}"
    wrong, checked = [], 0
    for text, names in bullets.items():
        for m in NAMED_VALUE.finditer(text):
            values = {name: lookup(preset_dict(name), m[1]) for name in names}
            setting = {name: v for name, v in values.items() if v is not MISSING}
            checked += 1
            if not setting:
                wrong.append(f"{'/'.join(names)}: {m[1]} is set by none of them")
            for name, value in setting.items():
                if value != yaml.safe_load(m[2]):
                    wrong.append(f"{name}: {m[1]} is {value!r}, the doc says {m[2]}")
    assert checked >= 20, "expected the bullets to name preset values; is the pattern right?"
    assert not wrong, "\n".join(wrong)
