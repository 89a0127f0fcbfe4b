"""The probe-venv cache (tests/_probe_venvs.py) stays under its cap: least recently used venvs go
first, never one this session uses, one another session holds the lock of, or one used in the last hour."""

from __future__ import annotations

import fcntl
import os
import time

import _probe_venvs as venvs
import pytest

MB = 1000 ** 2


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(venvs, "VENV_ROOT", tmp_path)
    monkeypatch.setattr(venvs, "_USED_HERE", set())
    return tmp_path


def venv(root, name: str, size_mb: int, used_hours_ago: float):
    folder = root / name
    folder.mkdir()
    (folder / "lib.bin").write_bytes(os.urandom(size_mb * MB))     # real blocks: du counts them
    marker = folder / venvs.MARKER
    marker.write_text("{}")
    when = time.time() - used_hours_ago * 3600
    os.utime(marker, (when, when))


def test_least_recently_used_venvs_go_first_until_under_the_cap(cache):
    venv(cache, "old", 3, used_hours_ago=30)
    venv(cache, "older", 3, used_hours_ago=50)
    venv(cache, "recent", 3, used_hours_ago=2)
    assert venvs.evict(7 * MB) == ["older"]
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == ["old", "recent"]
    assert venvs.evict(20 * MB) == []                   # under the cap: nothing goes


def test_what_is_in_use_is_never_evicted(cache):
    venv(cache, "ours", 3, used_hours_ago=40)
    venv(cache, "locked", 3, used_hours_ago=30)
    venv(cache, "another-session-now", 3, used_hours_ago=0.1)
    venv(cache, "idle", 3, used_hours_ago=20)
    venvs._USED_HERE.add("ours")
    with open(cache / "locked.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)               # another session builds or checks it
        assert venvs.evict(1 * MB) == ["idle"]
    # The session is over: its own venvs may go, least recently used first.
    assert venvs.evict(1 * MB, session_over=True) == ["ours", "locked"]
    assert [p.name for p in cache.iterdir() if p.is_dir()] == ["another-session-now"]

