"""Taking turns on a file: an advisory ``fcntl.flock`` held while a ``with`` block runs, so two runs (or two
jobs of one run, in threads: each opens its own descriptor) that would write the same folder never
interleave. The second waits, cancellably, and then goes on; a holder that dies releases its turn, because
the kernel drops a dead process's ``flock``. Used by builds of one stack into one ``--out`` folder
(:mod:`stackforge.build.claim`) and by jobs sharing one JIT build cache (:mod:`stackforge.jobs.job_runner`).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: How often a waiting run looks again (and at its cancel flag).
POLL_S = 0.2


@contextmanager
def file_turn(path: Path, *, holder: str, cancelled: Callable[[float], bool],
              tell: Callable[[str], None] = lambda holder: None) -> Iterator[bool]:
    """Hold the turn on ``path`` (created if missing) while the ``with`` block runs; yields False when
    ``cancelled(POLL_S)`` (which waits up to that long) said so while waiting: the block must then not start.

    ``holder`` is written into the file, so a waiting run can say whom it waits for: ``tell`` gets that
    holder once, when the wait begins.
    """
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
                    tell(os.pread(handle, 200, 0).decode(errors="replace").strip() or "another run")
                    told = True
                if cancelled(POLL_S):
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
