"""The report's shape: a `Report` of claims and `Section`s, each a table with its words and
figure; what `sections.build` fills and `pages` renders."""

from __future__ import annotations

from dataclasses import dataclass, field

from benchbatch.output.report.claims import Claim


@dataclass
class Section:
    title: str
    intro: list[str]
    headers: list[str]
    rows: list[list[str]]
    image: str | None = None  # a PNG file name in the run folder
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    title: str
    notices: list[str]  # shown first, in bold (CPU-sized run, failed parts)
    facts: list[tuple[str, str]]  # what was run, on what
    claims: list[Claim]
    sections: list[Section]
    files: list[str]
