"""What the terminal shows during and after a build run (rich).

:class:`Board` is the shared, lock-protected state the workers update (phase, status, timing);
:class:`ProgressView` redraws it live from the main thread; :func:`summary_table` is the final table.
The tables are built by pure functions of a snapshot, so they can be tested without a terminal.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.table import Table

from stackforge.build.records import BuildStatus

if TYPE_CHECKING:
    from stackforge.build.scheduler import BuildSummary

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


def summary_table(summary: "BuildSummary") -> Table:
    """The final table: status, image, size, time and the reason of every stack."""
    counts = ", ".join(f"{summary.count(s)} {s.value}" for s in BuildStatus if summary.count(s))
    table = Table(title=f"build summary ({summary.builder}, {summary.duration_s:.0f} s): {counts}")
    for column in ("stack", "status", "image", "size", "time", "reason / log"):
        table.add_column(column, overflow="fold")
    for record in summary.records:
        style = _STYLE.get(record.status.value, "")
        size = f"{record.image_size / 1e9:.2f} GB" if record.image_size else "-"
        seconds = sum(record.durations.values())
        note = record.reason or ("base: " + record.base.note if record.base and record.base.note else "")
        if record.status is BuildStatus.FAILED and record.log_path:
            note = f"{note} (log: {record.log_path})"
        table.add_row(record.stack_id, f"[{style}]{record.status.value}[/]", record.image_tag or "-", size,
                      f"{seconds:.0f} s", note)
    return table


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
