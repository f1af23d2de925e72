"""Where an example came from, and the one error type that user data can raise."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """The place of one record: a file (or hub name) and a 1-based line (or row) number.

    `unit` is "line" for text files (JSON Lines, JSON) and "row" for tables (Parquet, hub datasets),
    whose records have no line. `line` is None for errors about a whole file.
    """

    file: str
    line: int | None = None
    unit: str = "line"

    def __str__(self) -> str:
        if self.line is None:
            return self.file
        if self.unit == "line":
            return f"{self.file}:{self.line}"
        return f"{self.file}:{self.unit} {self.line}"


class DataError(ValueError):
    """A problem in user data, reported as "FILE:LINE: what is wrong. Fix: how to fix it"."""

    def __init__(self, source: Source | str, problem: str, fix: str) -> None:
        self.source = source if isinstance(source, Source) else Source(str(source))
        self.problem = problem.rstrip(".")
        self.fix = fix
        super().__init__(f"{self.source}: {self.problem}. Fix: {fix}")

    @property
    def file(self) -> str:
        return self.source.file

    @property
    def line(self) -> int | None:
        return self.source.line
