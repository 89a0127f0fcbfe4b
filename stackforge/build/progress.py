"""What the terminal shows during and after a build run (rich).

:class:`Board` is the shared, lock-protected state the workers update (phase, status, timing);
:class:`ProgressView` redraws it live from the main thread; :func:`summary_table` is the final table.
The tables are built by pure functions of a snapshot, so they can be tested without a terminal.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

from rich.console import Console
from rich.live import Live
from rich.table import Table

from stackforge.build.records import BuildStatus, BuildSummary

_STYLE = {"built": "green", "cached": "cyan", "failed": "red", "skipped": "yellow", "interrupted": "magenta"}


@dataclass(frozen=True, slots=True)
class Row:
    """One stack's line on the board."""

    stack_id: str
    phase: str = "queued"
    status: str = ""
    started: float | None = None
    finished: float | None = None

    def elapsed(self, now: float) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or now) - self.started


class Board:
    """Per-stack progress shared between workers (writers) and the view (reader)."""

    def __init__(self, stack_ids: list[str]) -> None:
        self._lock = threading.Lock()
        self._rows = {stack_id: Row(stack_id) for stack_id in stack_ids}

    def update(self, stack_id: str, *, phase: str | None = None, status: str | None = None,
               done: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            row = self._rows.get(stack_id, Row(stack_id))
            row = replace(row, phase=row.phase if phase is None else phase,
                          status=row.status if status is None else status,
                          started=row.started if row.started is not None else now,
                          finished=now if done else row.finished)
            self._rows[stack_id] = row

    def snapshot(self) -> list[Row]:
        with self._lock:
            return list(self._rows.values())


def progress_table(rows: list[Row], now: float) -> Table:
    """The live view: one line per stack with its phase or final status."""
    table = Table(title="stackforge build", expand=False)
    table.add_column("stack")
    table.add_column("state")
    table.add_column("time", justify="right")
    for row in rows:
        state = row.status or row.phase or "queued"
        style = _STYLE.get(row.status, "")
        table.add_row(row.stack_id, f"[{style}]{state}[/]" if style else state, f"{row.elapsed(now):.0f} s")
    return table


#: Room the status, image, size, time and reason columns need beside a whole stack id to stay readable.
_WIDE_EXTRA = 64


def summary_table(summary: BuildSummary, width: int | None = None) -> Table:
    """The final table: status, image, size, time and the reason of every stack.

    Stack ids are never broken: where ``width`` (the console's) cannot hold an id beside the other
    columns, each stack becomes one block (its id whole on the first line, the rest below it).
    Reasons and log paths wrap; nothing is cut.
    """
    counts = ", ".join(f"{summary.count(s)} {s.value}" for s in BuildStatus if summary.count(s))
    title = f"build summary ({summary.builder}, {summary.duration_s:.0f} s): {counts}"
    longest = max((len(r.stack_id) for r in summary.records), default=0)
    if width is not None and width < longest + _WIDE_EXTRA:
        return _summary_blocks(summary, title)
    table = Table(title=title)
    table.add_column("stack", no_wrap=True, min_width=longest)
    for column in ("status", "image", "size", "time", "reason / log"):
        table.add_column(column, overflow="fold")
    for record in summary.records:
        style = _STYLE.get(record.status.value, "")
        table.add_row(record.stack_id, f"[{style}]{record.status.value}[/]{_verified(record)}", record.image_tag or "-",
                      _size(record), _seconds(record), _note(record))
    return table


def _summary_blocks(summary: BuildSummary, title: str) -> Table:
    """One row per stack in a single column: the id whole, then status, size, time, image and reason."""
    table = Table(title=title, show_lines=True)
    table.add_column("stack · status, size, time · image · reason / log", overflow="fold")
    for record in summary.records:
        style = _STYLE.get(record.status.value, "")
        status = f"[{style}]{record.status.value}[/]" if style else record.status.value
        lines = [record.stack_id, f"  {status}{_verified(record)} · {_size(record)} · {_seconds(record)}"]
        if record.image_tag:
            lines.append(f"  image: {record.image_tag}")
        if _note(record):
            lines.append(f"  {_note(record)}")
        table.add_row("\n".join(lines))
    return table


def _verified(record) -> str:
    """What verification inside the image found: ``, verified (10 checks)``; nothing when it did not run."""
    checks = record.verify.get("checks") or []
    if not checks:
        return ""
    failed = [c["name"] for c in checks if c.get("status") not in ("pass", "skip")]
    if failed:
        return f", verification failed ({', '.join(failed)})"
    return f", verified ({len(checks)} checks)"


def _size(record) -> str:
    return f"{record.image_size / 1e9:.2f} GB" if record.image_size else "-"


def _seconds(record) -> str:
    return f"{sum(record.durations.values()):.0f} s"


def _note(record) -> str:
    note = record.reason or ("base: " + record.base.note if record.base and record.base.note else "")
    if record.status is BuildStatus.FAILED and record.log_path:
        note = f"{note} (log: {record.log_path})"
    return note


class ProgressView:
    """A rich Live view of a :class:`Board`, refreshed by the main thread."""

    def __init__(self, board: Board, console: Console | None = None) -> None:
        self._board = board
        self._live = Live(progress_table(board.snapshot(), time.monotonic()),
                          console=console or Console(stderr=True), auto_refresh=False, transient=True)

    def start(self) -> None:
        self._live.start()

    def refresh(self) -> None:
        self._live.update(progress_table(self._board.snapshot(), time.monotonic()), refresh=True)

    def stop(self) -> None:
        self._live.stop()
