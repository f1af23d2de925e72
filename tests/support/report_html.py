"""Read a report.html back (tests.support.report_html): section titles, figures, table cells."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path


class ReportPage(HTMLParser):
    """`h2`/`h3` titles in order, `img` sources and alt texts per h2 section, each table's rows of cell texts
    per section, and the text of every `p` per section."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.h2: list[str] = []
        self.h3: dict[str, list[str]] = {}
        self.images: dict[str, list[tuple[str, str]]] = {}
        self.tables: dict[str, list[list[list[str]]]] = {}
        self.paragraphs: dict[str, list[str]] = {}
        self._text: list[str] | None = None
        self._tag: str | None = None
        self.feed(text)

    @classmethod
    def of(cls, path: str | Path) -> ReportPage:
        return cls(Path(path).read_text(encoding="utf-8"))

    @property
    def section(self) -> str:
        return self.h2[-1] if self.h2 else ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("h2", "h3", "td", "th", "p"):
            self._tag, self._text = tag, []
        elif tag == "table":
            self.tables.setdefault(self.section, []).append([])
        elif tag == "tr":
            self.tables[self.section][-1].append([])
        elif tag == "img":
            self.images.setdefault(self.section, []).append((attrs.get("alt", ""), attrs.get("src", "")))

    def handle_data(self, data):
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag != self._tag or self._text is None:
            return
        text = "".join(self._text)
        if tag == "h2":
            self.h2.append(text)
        elif tag == "h3":
            self.h3.setdefault(self.section, []).append(text)
        elif tag in ("td", "th"):
            self.tables[self.section][-1][-1].append(text)
        elif tag == "p":
            self.paragraphs.setdefault(self.section, []).append(text)
        self._tag, self._text = None, None

    def rows(self, section: str, first_header: str) -> dict[str, list[str]]:
        """The rows of the section's table whose first header cell is `first_header`, by first cell."""
        for rows in self.tables.get(section, []):
            if rows and rows[0] and rows[0][0] == first_header:
                return {row[0]: row[1:] for row in rows[1:]}
        raise AssertionError(f"no table headed {first_header!r} in {section!r}: {self.tables.get(section)}")

    def text(self, section: str) -> str:
        cells = [" ".join(row) for rows in self.tables.get(section, []) for row in rows]
        return "\n".join(self.paragraphs.get(section, []) + self.h3.get(section, []) + cells)
