"""One build of a stack at a time per ``--out`` folder: two runs that build the same stack into the same
folder take turns on an advisory file lock (``fcntl.flock``), so their contexts, image tag and record
never interleave. The second waits (cancellably) and then builds; a run that dies releases its turn,
because the kernel drops a dead process's ``flock``.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from stackforge.build.cancel import Cancel

#: How often a waiting build looks again (and at Ctrl-C).
POLL_S = 0.2


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
    path = claim_path(out_dir, stack_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        told = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    other = os.pread(handle, 64, 0).decode(errors="replace").strip() or "another run"
                    tell(f"waiting for build run {other}, which is building {stack_id} into {out_dir}")
                    told = True
                if cancel.wait(POLL_S):
                    yield False
                    return
        os.ftruncate(handle, 0)
        os.pwrite(handle, holder.encode(), 0)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        os.close(handle)
