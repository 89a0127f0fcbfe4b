"""Writing files so that a reader never sees half of one: the one atomic write stackforge uses.

Results, build records, rendered build contexts and ``--out`` files all go through
:func:`atomic_write_text`, so an interrupted run (Ctrl-C, a full disk, a killed process) leaves
either the old file or the complete new one, never a torn one.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["atomic_write_text"]


def atomic_write_text(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` so that readers only ever see the old or the complete new file.

    The temporary file lives in the same folder (``os.replace`` is only atomic within one file
    system) and its name starts with ``.`` so the results loader never mistakes it for a record. It
    is created with mode 0666 and the process umask applies, as for any file ``open()`` creates
    (``tempfile.mkstemp`` would make every result 0600 whatever the umask); ``mode`` sets an
    exact mode instead (a build context file that ``COPY`` must keep readable).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = _create_temporary(path)
    try:
        if mode is not None:
            os.fchmod(handle, mode)
        with os.fdopen(handle, "w", encoding="utf-8") as tmp:
            tmp.write(text)
            tmp.flush()
            os.fsync(tmp.fileno())   # the data is on disk before the name points at it
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _create_temporary(path: Path) -> tuple[int, Path]:
    """A new, exclusively created ``.<name>.<random>.tmp`` beside ``path``: (descriptor, path)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        candidate = path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp"
        try:
            return os.open(candidate, flags, 0o666), candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")
