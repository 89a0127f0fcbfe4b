"""Plain-text tables and paragraphs that fit a terminal width (pure functions returning lines).

``width=None`` means "no limit": the full text on one line per row, as written to a file or a
pipe. With a width, cells wrap at word boundaries and the key column (a stack id) is never
broken; when the other columns would get too narrow to read, each row becomes a block: the key
on its own line, then one ``name: value`` line per column. Nothing is ever cut off.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

GAP = "  "
MIN_COLUMN = 12     # below this a wrapped column is unreadable: switch to blocks
_ALIGNED = re.compile(r"(\S+(?: \S+)?\s{2,})\S")   # "label    value": a label, then a gap of 2+ spaces


def fit_table(rows: Sequence[Sequence[str]], headers: Sequence[str], width: int | None = None) -> list[str]:
    """A table whose first column (the key) stays whole; the others wrap to fit ``width``."""
    rows = [[str(cell) for cell in row] for row in rows]
    natural = [max(len(r[i]) for r in [list(headers), *rows]) for i in range(len(headers))]
    total = sum(natural) + len(GAP) * (len(headers) - 1)
    if width is None or total <= width:
        return _render(rows, headers, natural)
    longest_word = [max((len(w) for r in [list(headers), *rows] for w in r[i].split()), default=0)
                    for i in range(len(headers))]
    widths = _shrink(natural, width, longest_word)
    if widths is None:
        return _blocks(rows, headers, width)
    return _render(rows, headers, widths)


def wrap_line(line: str, width: int | None) -> list[str]:
    """One line wrapped to ``width``, continuation lines indented under its text (only a word longer than
    a whole line is split)."""
    if width is None or len(line) <= width:
        return [line]
    stripped = line.lstrip(" ")
    indent = " " * (len(line) - len(stripped))
    hanging = indent + " " * _hang(stripped)
    return textwrap.wrap(stripped, width=width, initial_indent=indent, subsequent_indent=hanging,
                         break_long_words=True, break_on_hyphens=False) or [line]


def _hang(text: str) -> int:
    """Where continuation lines start: under the value of ``label: value`` or ``label   value``, else 2."""
    aligned = _ALIGNED.match(text)
    if aligned:
        return len(aligned.group(1))
    head, sep, _ = text.partition(": ")
    if sep and " " not in head.removeprefix("- ") and len(head) < 30:
        start = len(head) + 2
        return start + len(text[start:]) - len(text[start:].lstrip(" "))
    return 2


def wrap_text(text: str, width: int | None) -> str:
    """Every line of ``text`` wrapped with :func:`wrap_line`."""
    return "\n".join(out for line in text.split("\n") for out in wrap_line(line, width))


def _shrink(natural: list[int], width: int, longest_word: list[int]) -> list[int] | None:
    """Column widths within ``width``: the key keeps its width, the rest share what is left.

    ``None`` when a column would have to break its words (an id, a name) or drop below MIN_COLUMN.
    """
    room = width - natural[0] - len(GAP) * (len(natural) - 1)
    widths = list(natural)
    pending = sorted(range(1, len(natural)), key=lambda i: natural[i])
    while pending:
        share = room // len(pending)
        column = pending.pop(0)
        widths[column] = min(natural[column], share)
        if widths[column] < min(natural[column], max(MIN_COLUMN, longest_word[column])):
            return None
        room -= widths[column]
    return widths


def _render(rows: list[list[str]], headers: Sequence[str], widths: list[int]) -> list[str]:
    lines = _row_lines(list(headers), widths)
    lines.append(GAP.join("-" * w for w in widths).rstrip())
    for row in rows:
        lines += _row_lines(row, widths)
    return lines


def _row_lines(row: list[str], widths: list[int]) -> list[str]:
    cells = [_wrap_cell(cell, w) if i else [cell] for i, (cell, w) in enumerate(zip(row, widths))]
    height = max(len(c) for c in cells)
    out = []
    for n in range(height):
        parts = [(c[n] if n < len(c) else "").ljust(w) for c, w in zip(cells, widths)]
        out.append(GAP.join(parts).rstrip())
    return out


def _wrap_cell(text: str, width: int) -> list[str]:
    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width=width, break_long_words=False, break_on_hyphens=False) or [""]


def _blocks(rows: list[list[str]], headers: Sequence[str], width: int) -> list[str]:
    """One block per row: the key whole on its own line, then ``header: value`` lines."""
    label = max(len(h) for h in headers[1:]) + 2
    lines = []
    for row in rows:
        lines.append(row[0])
        for header, cell in zip(headers[1:], row[1:]):
            if not cell:
                continue
            lines += textwrap.wrap(f"{header + ':':<{label}}{cell}", width=width, initial_indent="    ",
                                   subsequent_indent=" " * (4 + label), break_long_words=True,
                                   break_on_hyphens=False)
    return lines


#: How long a reason may be on a one-line-per-feature screen before it is cut (``brief``).
BRIEF = 100


def brief(text: str, limit: int = BRIEF) -> str:
    """``text`` on one line, at most about ``limit`` characters: cut after the last sentence or clause that
    fits, else at a word, never silently: a cut text ends with ``… (+N chars)``. The full text is for
    ``--evidence``, the JSON and the HTML."""
    flat = " ".join(str(text).split())
    if len(flat) <= limit:
        return flat
    head = flat[:limit]
    # A boundary a reader can stop at: the end of a sentence or clause, else a space.
    cut = max(head.rfind(". "), head.rfind("; "), head.rfind(": "), head.rfind(", "))
    if cut < limit // 2:
        cut = head.rfind(" ")
    if cut <= 0:
        cut = limit
    kept = flat[:cut].rstrip(" .;:,")
    return f"{kept} … (+{len(flat) - len(kept)} chars)"
