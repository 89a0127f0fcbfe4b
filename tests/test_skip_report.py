"""Skips are classified by how they were raised and counted by reason at the end of a run (_skips.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _skips import GpuOnlySkip, host_gpu_count, require_host_gpus

TESTS = Path(__file__).resolve().parent

SAMPLE = '''
import pytest
from _skips import skip_gpu_only

@pytest.fixture
def gpus():
    skip_gpu_only("needs a GPU")

def test_gpu_in_the_body():
    skip_gpu_only("needs a GPU")

def test_gpu_in_a_fixture(gpus):
    pass

def test_a_missing_tool():
    pytest.skip("needs   a\\ntool")          # folded onto one line in the table

@pytest.mark.gpu
def test_marked_gpu_but_skipped_for_another_reason():
    pytest.skip("needs a tool")               # the marker does not make a skip GPU-only

def test_passes():
    pass
'''


def _run_sample(tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp_path / "conftest.py").write_text(
        "from _skips import pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401\n"
        "def pytest_configure(config):\n    config.addinivalue_line('markers', 'gpu: GPU')\n")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    report = tmp_path / "skips.tsv"
    env = {**os.environ, "PYTHONPATH": str(TESTS), "STACKFORGE_SKIP_REPORT": str(report)}
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
                          check=False)
    return done, report


def test_skips_are_counted_by_kind_and_reason_before_pytest_s_final_line(tmp_path):
    done, report = _run_sample(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert report.read_text().splitlines() == ["other\t2\tneeds a tool", "gpu-only\t2\tneeds a GPU"]
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert "1 passed, 4 skipped" in lines[-1]                        # pytest's own line stays the last
    table = lines.index(next(line for line in lines if "skips by reason" in line))
    assert lines[table + 1:-1] == ["other        2  needs a tool", "gpu-only     2  needs a GPU",
                                   "4 skipped: 2 gpu-only, 2 other"]
    assert table > lines.index(next(line for line in lines if "short test summary info" in line))


def test_require_host_gpus_skips_gpu_only_when_the_host_has_too_few():
    found, _ = host_gpu_count()
    with pytest.raises(GpuOnlySkip, match=f"needs {found + 1} NVIDIA GPU"):
        require_host_gpus(found + 1)
    require_host_gpus(found)   # enough: no skip
