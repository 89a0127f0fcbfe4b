"""Cooperative cancellation for a build run (Ctrl-C while builds run in worker threads).

Python delivers SIGINT to the main thread only. The main thread therefore calls :meth:`Cancel.cancel`,
and every worker has registered, for the step it is in, a callback that stops that step from the
outside (close the classic build's HTTP stream), or handed the flag to :func:`stackforge.edges.runner.run`,
which stops a command's process group when it is set (``docker buildx``). Workers
also poll :attr:`Cancel.requested` between phases and sleep through :meth:`Cancel.wait`.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Cancel:
    """A cancellation flag plus the stop callbacks of the steps running right now."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def is_set(self) -> bool:
        """The flag, for :func:`stackforge.edges.runner.run`'s ``cancel`` (it stops the command's process group)."""
        return self._event.is_set()

    def cancel(self) -> None:
        """Set the flag and stop every registered step (each callback runs once)."""
        self._event.set()
        with self._lock:
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
        for callback in callbacks:
            callback()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when cancelled meanwhile (for retry backoff)."""
        return self._event.wait(seconds)

    @contextmanager
    def on_cancel(self, callback: Callable[[], None]) -> Iterator[None]:
        """Run ``callback`` if the run is cancelled while the ``with`` block runs (or already was)."""
        key = next(self._ids)
        with self._lock:
            self._callbacks[key] = callback
        if self._event.is_set():
            self.cancel()
        try:
            yield
        finally:
            with self._lock:
                self._callbacks.pop(key, None)
