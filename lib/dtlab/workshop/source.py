"""Read a lab source: one ``solutions/NN_name.py`` file in jupytext's "percent" format.

A lab is written once, as a plain Python file, and built into two notebooks (see
:mod:`dtlab.workshop.build`). The file is a sequence of cells, each opened by a marker line::

    # %% [markdown]
    # ## Ring all-reduce
    # Every line of a markdown cell is a comment; the leading ``# `` is removed.

    # %%
    def ring_all_reduce(tensor):
        # BEGIN SOLUTION
        ...
        # END SOLUTION

    # %% tags=["slow"]
    check_exercise("collectives.ring_all_reduce", ring_all_reduce, cluster)

A marker may carry a title (``# %% Setup``, kept as ``title`` metadata, as jupytext does) and
``key=value`` metadata whose values are JSON (``tags=["a", "b"]``). ``[markdown]`` (or ``[md]``)
and ``[raw]`` choose the cell type; anything else is a code cell. Blank lines around a cell's body
are dropped, so the blank line that separates cells in the source never reaches the notebook.
Text before the first marker (a jupytext ``# ---`` header, a comment) is ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

_MARKER = re.compile(r"^# %%(?P<rest>.*)$")
_CELL_TYPE = re.compile(r"\[(?P<kind>markdown|md|raw)\]")
_METADATA_KEY = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)=")
_EXPLICIT_ANCHOR = re.compile(r"""<a\s+(?:id|name)\s*=\s*["'](?P<anchor>[^"']+)["']""")


class LabSourceError(ValueError):
    """A lab source that cannot be built; the message names ``file:line``."""


@dataclass
class Cell:
    """One notebook cell as written in the source.

    ``line`` is the 1-based line number of the cell's first body line in the source file, so
    errors found inside a cell can point at the exact line.
    """

    cell_type: str  # "code", "markdown" or "raw"
    source: str
    line: int
    metadata: dict = field(default_factory=dict)

    @property
    def tags(self) -> list[str]:
        return list(self.metadata.get("tags", []))


@dataclass
class LabSource:
    """A parsed lab: its name (``00_setup``), path and cells in order."""

    name: str
    path: Path
    cells: list[Cell]

    @property
    def code_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.cell_type == "code"]


def parse_marker_options(rest: str, where: str) -> tuple[str, dict]:
    """Split what follows ``# %%`` into a cell type and a metadata dict.

    >>> parse_marker_options(' [markdown] tags=["intro"]', "x.py:1")
    ('markdown', {'tags': ['intro']})
    """
    cell_type = "code"
    found = _CELL_TYPE.search(rest)
    if found:
        cell_type = "raw" if found["kind"] == "raw" else "markdown"
        rest = rest[: found.start()] + rest[found.end() :]
    metadata: dict = {}
    keys = list(_METADATA_KEY.finditer(rest))
    title = rest[: keys[0].start()] if keys else rest
    decoder = json.JSONDecoder()
    position = keys[0].start() if keys else len(rest)
    while position < len(rest):
        key = _METADATA_KEY.match(rest, position)
        if key is None:
            raise LabSourceError(
                f"{where}: cannot read cell metadata {rest[position:].strip()!r}; "
                'write key=JSON pairs, e.g. # %% tags=["slow"]'
            )
        try:
            value, end = decoder.raw_decode(rest, key.end())
        except json.JSONDecodeError as err:
            raise LabSourceError(
                f"{where}: the value of {key['key']!r} is not JSON ({err.msg}); "
                'write e.g. tags=["slow"] with double quotes'
            ) from None
        metadata[key["key"]] = value
        position = end
        while position < len(rest) and rest[position].isspace():
            position += 1
    if title.strip():
        metadata["title"] = title.strip()
    return cell_type, metadata


def _strip_markdown_comment(line: str, where: str) -> str:
    if line.startswith("# "):
        return line[2:]
    if line.rstrip() == "#" or not line.strip():
        return ""
    raise LabSourceError(
        f"{where}: a markdown cell line must start with '# ' (found {line.strip()[:40]!r}); "
        "prefix every markdown line with '# ' or open a code cell with '# %%'"
    )


def _trim_blank_lines(lines: list[str], first_line: int) -> tuple[list[str], int]:
    while lines and not lines[0].strip():
        lines = lines[1:]
        first_line += 1
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines, first_line


def parse_lab_source(text: str, path: Path | str = "<lab>") -> LabSource:
    """Parse percent-format ``text`` into cells. ``path`` names the lab and appears in errors."""
    path = Path(path)
    cells: list[Cell] = []
    current: tuple[str, dict, int] | None = None  # cell type, metadata, first body line
    body: list[str] = []

    def close_cell() -> None:
        if current is None:
            return
        cell_type, metadata, first_line = current
        lines, first_line = _trim_blank_lines(body, first_line)
        if cell_type == "markdown":
            lines = [
                _strip_markdown_comment(line, f"{path}:{first_line + i}")
                for i, line in enumerate(lines)
            ]
        cells.append(Cell(cell_type, "\n".join(lines), first_line, metadata))

    for number, line in enumerate(text.splitlines(), start=1):
        marker = _MARKER.match(line)
        if marker:
            close_cell()
            cell_type, metadata = parse_marker_options(marker["rest"], f"{path}:{number}")
            current, body = (cell_type, metadata, number + 1), []
        elif current is not None:
            body.append(line.rstrip())
    close_cell()
    if not cells:
        raise LabSourceError(f"{path}:1: no '# %%' cell markers; a lab source is a list of cells")
    return LabSource(name=path.stem, path=path, cells=cells)


def read_lab_source(path: Path | str) -> LabSource:
    """Read and parse one lab source file."""
    path = Path(path)
    return parse_lab_source(path.read_text(encoding="utf-8"), path)


def explicit_anchors(markdown: str) -> list[str]:
    """The ``<a id=...>`` (or ``name=``) anchors of one markdown text, in order: the stable
    targets of quiz links (:mod:`dtlab.quiz.links`) and the ids of section cells
    (:func:`dtlab.workshop.build.section_cell_id`)."""
    return [m["anchor"] for m in _EXPLICIT_ANCHOR.finditer(markdown)]
