"""Write the values table of charts/rollout-fleet/README.md from values.yaml's ``# --`` comments (helm-docs style).

    .venv/bin/python scripts/chart_readme.py [--check]

A ``# --`` comment documents the key on the line below it; the ``#`` lines that follow it in the same comment block
continue the description. A key without one (``image:``, ``operator:``) is only a group: its documented keys are
listed. Each row is the key's dotted path, its type, its default (as JSON, like helm-docs) and the description.
Everything between the ``<!-- values-table:begin -->`` and ``<!-- values-table:end -->`` markers is generated; the
rest of the README is prose. ``--check`` exits 1 if the README differs from what values.yaml gives.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

BEGIN = "<!-- values-table:begin -->"
END = "<!-- values-table:end -->"
ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "rollout-fleet"
_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z0-9_./-]+):(\s|$)")
_DOC = "# --"


@dataclass(frozen=True)
class Row:
    """One documented value."""

    key: str
    type: str
    default: str
    description: str


def _description(comments: list[str]) -> str | None:
    """The ``# --`` description in a comment block (the lines right above a key), or None if it has none."""
    for index, line in enumerate(comments):
        if line.startswith(_DOC):
            parts = [line.removeprefix(_DOC)] + [rest.removeprefix("#") for rest in comments[index + 1 :]]
            return " ".join(" ".join(parts).split())
    return None


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def _cell(text: str) -> str:
    """Table-cell text: a pipe would end the cell, ``<release>`` would be read as an HTML tag and vanish, and a ``*``
    could start emphasis."""
    return text.replace("|", "\\|").replace("<", "\\<").replace("*", "\\*")


def rows(values_text: str) -> list[Row]:
    """Every documented key of a values.yaml text, in file order. Pure: text in, rows out."""
    values = yaml.safe_load(values_text)
    found: list[Row] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the mappings enclosing the current line
    comments: list[str] = []
    for line in values_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        match = _KEY.match(line)
        if match is None:
            comments = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        description = _description(comments)
        comments = []
        if description is None:
            continue
        path = [key for _, key in stack]
        value: Any = values
        for key in path:
            value = value[key]
        found.append(Row(".".join(path), _type(value), json.dumps(value), description))
    return found


def render(table_rows: list[Row]) -> str:
    """The Markdown table (between the markers)."""
    lines = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for row in table_rows:
        default = row.default.replace("|", "\\|")  # a code span keeps < as is
        lines.append(f"| `{row.key}` | {row.type} | `{default}` | {_cell(row.description)} |")
    return "\n".join(lines) + "\n"


def updated_readme(readme_text: str, values_text: str) -> str:
    """The README with its values table regenerated from values.yaml; the prose around the markers is kept."""
    head, begin, rest = readme_text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the README has no {BEGIN} ... {END} markers")
    return f"{head}{BEGIN}\n{render(rows(values_text))}{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--chart", type=Path, default=CHART)
    parser.add_argument("--check", action="store_true", help="exit 1 if the README is not current")
    args = parser.parse_args()
    readme = args.chart / "README.md"
    text = readme.read_text()
    updated = updated_readme(text, (args.chart / "values.yaml").read_text())
    if args.check:
        if updated != text:
            print(f"{readme} is stale: run `.venv/bin/python scripts/chart_readme.py`")
            return 1
        return 0
    readme.write_text(updated)
    print(f"wrote {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
