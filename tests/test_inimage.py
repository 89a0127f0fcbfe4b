"""The in-image package (``stackforge/inimage``): mounted once for every probe and bench script, on
``PYTHONPATH``, and free of anything but the standard library.

The test session itself puts the package on ``PYTHONPATH`` (conftest: tests start scripts by hand),
so these tests take it away first: what a script finds then is what the runner gave it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from _probe_runs import ProbeContext, run_locally

from stackforge.bench.catalog import catalog as bench_catalog
from stackforge.bench.run import BenchOptions, bench_kind
from stackforge.core.model import Interconnect, Target
from stackforge.core.records import Status
from stackforge.edges.gpus import HostGpus
from stackforge.inimage import CONTAINER_DIR, HOST_DIR
from stackforge.jobs.job_runner import Job, script_env
from stackforge.probes.catalog import Preconditions, ProbeSpec
from stackforge.probes.execute import probe_kind

pytestmark = pytest.mark.fast

NO_HOST_GPUS = HostGpus(False, "no GPU on this test host")
TARGET = Target(name="rtx-pro-6000-x2-pcie", gpu="NVIDIA RTX PRO 6000 Blackwell", arch="12.0", gpu_count=2,
                interconnect=Interconnect.PCIE)


def _stack():
    from _build_helpers import small_cell
    return small_cell()[0]


def test_every_kind_mounts_the_package_once_beside_its_scripts():
    probe = ProbeSpec(id="t.gate", feature="p2p-access", tier="gate", script="ok.py", description="",
                      preconditions=Preconditions(), default_timeout_s=30)
    bench = next(spec for spec in bench_catalog() if spec.id == "bench.gemm")
    for kind, spec in ((probe_kind(), probe), (bench_kind(BenchOptions()), bench)):
        job = Job(_stack(), TARGET, spec, (), 30.0)
        mounts = kind.container_mounts(job)
        assert [(Path(m.source), m.target) for m in mounts].count((HOST_DIR, CONTAINER_DIR)) == 1, kind.name
        assert all(m.copy_to_remote for m in mounts if m.target != "/stackforge/model"), kind.name


def test_script_env_puts_the_package_first_and_keeps_a_local_path():
    assert script_env(CONTAINER_DIR)["PYTHONPATH"] == CONTAINER_DIR
    assert script_env(HOST_DIR, "/opt/mine")["PYTHONPATH"].split(":") == [str(HOST_DIR), "/opt/mine"]
    assert script_env(HOST_DIR)["PYTHONDONTWRITEBYTECODE"] == "1"


def test_a_local_script_imports_the_probe_helper_from_what_the_runner_gives(tmp_path, monkeypatch):
    """A real subprocess with no PYTHONPATH of its own: ``import _sfprobe`` works because the runner
    put the package there, and the helper it found is the package's file."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    (tmp_path / "uses_helper.py").write_text(
        "import _sfprobe as sf\nsf.emit('pass', 'imported the helper', sf.__file__)\n", encoding="utf-8")
    spec = ProbeSpec(id="t.helper", feature="p2p-access", tier="gate", script="uses_helper.py", description="",
                     preconditions=Preconditions(), default_timeout_s=60)
    record = run_locally(_stack(), spec, ProbeContext("t", TARGET, NO_HOST_GPUS, scripts_dir=tmp_path))
    assert record.outcome.status is Status.PASS, record.outcome.evidence
    assert Path(record.outcome.evidence).resolve() == HOST_DIR / "_sfprobe.py"


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_package_imports_the_standard_library_and_itself_only():
    own = {p.stem for p in HOST_DIR.glob("_*.py")}
    # torch, FlashInfer and SGLang are imported lazily inside functions, by name, through importlib.
    for path in sorted(HOST_DIR.glob("_*.py")):
        foreign = _imported_roots(path) - set(sys.stdlib_module_names) - own - {"__future__"}
        assert not foreign, f"{path.name} imports {sorted(foreign)}"


def test_captured_logs_keeps_each_message_once_and_restores_the_loggers():
    """The one log collector of the gate probes (FlashInfer's and SGLang's gates log their answer)."""
    import logging

    import _sfprobe as sf

    parent, child = logging.getLogger("sf-test-lib"), logging.getLogger("sf-test-lib.part")
    parent.setLevel(logging.ERROR)
    with sf.captured_logs("sf-test-lib", "sf-test-lib.part", level=logging.INFO) as messages:
        child.info("turned on by itself")          # reaches the child's and the parent's handler
        child.info("turned on by itself")
        parent.debug("below the level")
        parent.warning("disabled: %s", "PCIe")
    assert messages == ["turned on by itself", "disabled: PCIe"]
    assert parent.level == logging.ERROR and not parent.handlers and not child.handlers
