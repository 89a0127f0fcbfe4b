"""One build of a stack at a time per ``--out`` folder: two runs that build the same stack into the same
folder take turns (:func:`stackforge.edges.turns.file_turn`), so their contexts, image tag and record
never interleave. The second waits (cancellably) and then builds; a run that dies releases its turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from stackforge.build.cancel import Cancel
from stackforge.edges.turns import file_turn


def claim_path(out_dir: Path, stack_id: str) -> Path:
    """``<out>/builds/.<stack-id>.building``: held while a run builds that stack into ``out_dir``."""
    return Path(out_dir) / "builds" / f".{stack_id}.building"


@contextmanager
def stack_claim(out_dir: Path, stack_id: str, *, cancel: Cancel, holder: str,
                tell: Callable[[str], None] = lambda line: None) -> Iterator[bool]:
    """Hold the stack's turn in ``out_dir`` while the ``with`` block runs; yields False when the run was
    cancelled while waiting (the block must then not build).

    ``holder`` (the run id) is written into the file, so a waiting run can say whom it waits for.
    """
    def waiting(other: str) -> None:
        tell(f"waiting for build run {other}, which is building {stack_id} into {out_dir}")

    with file_turn(claim_path(out_dir, stack_id), holder=holder, cancelled=cancel.wait, tell=waiting) as ours:
        yield ours
