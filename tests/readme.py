"""The README's blocks, and matching what a command printed against what a
block shows, for the tests that run them.

A block's lines must appear in what was printed, in order. The README's own
elisions are honoured: a line ``...`` stands for any number of lines,
``...`` inside a line for any text, and run ids, ``<run-id>``, pids and
times for any value.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(kind: str) -> list[list[str]]:
    """The README's ```` ```kind ```` blocks, as lines."""
    found: list[list[str]] = []
    current: list[str] | None = None
    for line in README.read_text(encoding="utf-8").splitlines():
        if current is None:
            if line.strip() == f"```{kind}":
                current = []
        elif line.strip() == "```":
            found.append(current)
            current = None
        else:
            current.append(line)
    return found


def _pattern(line: str) -> re.Pattern[str]:
    """A README line as a pattern: its elisions and run-specific values match
    anything of their kind."""
    parts = re.split(
        r"(\.\.\.|<run-id>|\b\d{8}T\d{6}-[0-9a-f]{6}\b|pid \d+|\+\d+(?:\.\d+)? s)", line
    )
    pattern = []
    for index, part in enumerate(parts):
        if index % 2 == 0:
            pattern.append(re.escape(part))
        elif part == "...":
            pattern.append(".*")
        elif part.startswith("pid "):
            pattern.append(r"pid \d+")
        elif part.startswith("+"):
            pattern.append(r"\+\d+(?:\.\d+)? s")
        else:
            pattern.append(r"\d{8}T\d{6}-[0-9a-f]{6}")
    return re.compile("".join(pattern) + r"\Z")


def missing(expected: list[str], printed: list[str]) -> str | None:
    """The first expected line not found in order in ``printed``, else None."""
    position = 0
    for line in expected:
        if line.strip() == "...":
            continue
        pattern = _pattern(line)
        while position < len(printed) and not pattern.match(printed[position]):
            position += 1
        if position == len(printed):
            return line
        position += 1
    return None
