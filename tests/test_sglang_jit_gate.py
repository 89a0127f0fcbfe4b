"""The SGLang JIT gate probe (``sglang_jit_gate.py``, ``gate.sglang.jit``, feature ``sglang-jit``).

Decisions are pure functions of the worker's report, tested with the script's own dataclasses. The
script as a whole (parent, worker child, the timeout that kills the child's process group, the kept
cache) runs against a stand-in SGLang of the 0.5.2x layout written to a temporary folder: its loader
has the shape of ``sglang/kernels/jit/utils/compile/loader.py`` (build into a staging folder through
``ninja.build``, ``_load``, publish a ``deps-*`` leaf). The real-engine test runs the probe in the default
CUDA 13.1 image (the engine's, or one the session builds with ``stackforge build --cuda 13.1``), and again
with the image's ``$CUDA_HOME/lib64`` moved away, where the link must fail in the linker's words.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stackforge.plan.features import load_feature_catalog
from stackforge.probes.catalog import catalog

SCRIPTS = Path(__file__).resolve().parents[1] / "stackforge" / "probes" / "scripts"
INIMAGE = Path(__file__).resolve().parents[1] / "stackforge" / "inimage"
sys.path.insert(0, str(SCRIPTS))
try:
    import _sfprobe as sf
    import sglang_jit_gate as sj
finally:
    sys.path.remove(str(SCRIPTS))

SM120 = sf.parse_arch("12.0")
LINKER_WORDS = "/usr/bin/ld: cannot find -lcudart: No such file or directory"
NINJA_LINK_FAILURE = (f"Failed to build JIT module m in /c/.staging-1\nstdout:\n[1/2] nvcc -c cuda.cu -o cuda_0.o\n"
                      f"[2/2] c++ cuda_0.o -shared -lcudart -o m.so\nFAILED: [code=1] m.so\nc++ cuda_0.o -shared "
                      f"-lcudart -o m.so\n{LINKER_WORDS}\ncollect2: error: ld returned 1 exit status\n"
                      "ninja: build stopped: subcommand failed.")


def module(status: str = "built", **values) -> sj.ModuleOutcome:
    defaults = {"name": "kvcache", "call": "sglang.kernels.ops.kvcache.kvcache.can_use_store_cache(256)",
                "status": status, "stage": "link", "seconds": 9.7, "library": "/c/kv.so", "library_bytes": 1000,
                "link_flags": "-shared -L/cuda/lib64 -lcudart"}
    return sj.ModuleOutcome(**{**defaults, **values})


def report(*modules: sj.ModuleOutcome, **values) -> sj.Report:
    defaults = {"sglang": "0.5.23", "layout": "sglang.kernels.jit", "loader": "sglang...loader.load_jit",
                "nvcc": "/cuda/bin/nvcc", "nvcc_looked": "/cuda/bin/nvcc", "ninja": "/usr/bin/ninja",
                "arch": "12.0f", "arch_source": "override_jit_cuda_arch(12, 0)", "cache_dir": "/ws/sglang/c",
                "modules": modules}
    return sj.Report(**{**defaults, **values})


# --------------------------------------------------------------------------------------------- decisions

def test_a_module_built_by_sglangs_loader_is_a_pass_at_the_built_level():
    result = sj.decide(report(module()), SM120, False, 600)
    assert (result.status, result.metrics) == ("pass", {"evidence_level": "built"})
    assert result.reason == ("SGLang 0.5.23 built (compiled and linked) its kvcache JIT module for 12.0f through its "
                             "own loader (sglang...loader.load_jit) with /cuda/bin/nvcc in 9.7 s; tvm-ffi loaded it; "
                             "nothing was run (no GPU)")
    assert "ldflags: -shared -L/cuda/lib64 -lcudart" in result.evidence


def test_a_module_only_the_driver_can_load_is_still_built():
    needs_driver = module(load_error="not loadable without a driver: OSError: libcuda.so.1: cannot open shared "
                          "object file: No such file or directory")
    result = sj.decide(report(needs_driver), SM120, False, 600)
    assert (result.status, result.metrics) == ("pass", {"evidence_level": "built"})
    assert "loading it needs the GPU host's driver (libcuda.so.1); nothing was run" in result.reason


def test_a_link_failure_is_a_fail_in_the_linkers_words():
    broken = module("build-failed", stage=sj.failed_stage(NINJA_LINK_FAILURE), output=NINJA_LINK_FAILURE, library="")
    result = sj.decide(report(broken), SM120, False, 600)
    assert result.status == "fail"
    assert result.reason == f"SGLang 0.5.23's kvcache JIT module does not link for 12.0f (link): {LINKER_WORDS}"
    assert "evidence_level" not in result.metrics and LINKER_WORDS in result.evidence


def test_a_compile_failure_says_compile():
    words = "cuda.cu:3:10: fatal error: sgl_kernel/utils.cuh: No such file or directory"
    output = f"FAILED: [code=1] cuda_0.o\nnvcc -c cuda.cu -o cuda_0.o\n{words}\nninja: build stopped"
    assert sj.failed_stage(output) == "compile"
    result = sj.decide(report(module("build-failed", stage="compile", output=output)), SM120, False, 600)
    assert result.reason == f"SGLang 0.5.23's kvcache JIT module does not compile for 12.0f (compile): {words}"


def test_a_build_the_worker_was_still_in_is_a_timeout_never_a_fail():
    result = sj.decide(report(module("running", stage="compile")), SM120, True, 600)
    assert result.status == "timeout"
    assert "did not finish within its time limit (600 s)" in result.reason
    sf.result_line(result.status, result.reason)   # a status the result line may carry


def test_no_nvcc_and_nothing_prebuilt_fails_saying_the_image_cannot_jit():
    failed = module("build-failed", stage="compile", output="FileNotFoundError: nvcc", library="")
    result = sj.decide(report(failed, nvcc="", nvcc_looked="/opt/cuda/bin/nvcc"), SM120, False, 600)
    assert result.status == "fail" and result.reason.startswith("no nvcc in this flavour")
    assert "there is no nvcc at /opt/cuda/bin/nvcc: this image cannot JIT-compile it" in result.reason
    assert result.metrics == {"jit_possible": False}


def test_a_module_the_image_ships_prebuilt_is_admitted_not_built():
    result = sj.decide(report(module("prebuilt", stage="load"), nvcc=""), SM120, False, 600)
    assert (result.status, result.metrics) == ("pass", {"evidence_level": "admitted"})
    assert "prebuilt" in result.reason and "nothing built here" in result.reason


def test_a_release_without_jit_packages_skips():
    result = sj.decide(sj.Report(sglang="0.4.6"), SM120, False, 600)
    assert result.status == "skip" and result.reason.endswith("this release JIT-compiles none")


def test_a_loader_that_does_not_import_or_a_module_that_does_not_load_fails():
    broken = sj.decide(report(import_error="ImportError: libtvm_ffi.so: cannot open shared object file"),
                       SM120, False, 600)
    assert broken.status == "fail" and "JIT loader does not import: ImportError" in broken.reason
    unloadable = module(load_error="OSError: kv.so: undefined symbol: _ZN3c1010TensorImpl", status="load-failed")
    result = sj.decide(report(unloadable), SM120, False, 600)
    assert result.status == "fail" and "tvm-ffi cannot load it: OSError" in result.reason


def test_the_cache_goes_under_the_workspace_unless_the_image_sets_one():
    assert sj.cache_environment({}, "/ws/sglang") == {"SGLANG_JIT_CACHE_DIR": "/ws/sglang/sglang_jit_cache_dir",
                                                      "TVM_FFI_CACHE_DIR": "/ws/sglang/tvm_ffi_cache_dir"}
    image_set = sj.cache_environment({"SGLANG_JIT_CACHE_DIR": "/img"}, "/ws")
    assert image_set == {"TVM_FFI_CACHE_DIR": "/ws/tvm_ffi_cache_dir"}


def test_the_probe_is_declared_in_data_for_every_target_with_a_kept_cache():
    spec = next(s for s in catalog() if s.id == "gate.sglang.jit")
    assert (spec.feature, spec.tier, spec.script, spec.jit_cache) == ("sglang-jit", "gate", "sglang_jit_gate.py", True)
    assert spec.preconditions.min_gpus == 0 and not spec.preconditions.needs_gpu_arch
    budget = sj.parse_args(list(spec.args)).build_timeout
    assert spec.default_timeout_s > budget   # the script's own timeout comes first, with its evidence
    feature = load_feature_catalog().spec("sglang-jit")
    assert feature.question and not feature.needs
    assert [(tier.value, conclusion) for tier, conclusion in feature.tiers] == [("gate", "builds")]


# --------------------------------------------------------------------------------------------- the script

FAKE_LOADER = '''
import os, pathlib, shutil
from sglang.kernels.jit.utils.compile import ninja

def _load(path):
    if os.environ.get("FAKE_MODE") == "unloadable":
        raise OSError(f"{path}: undefined symbol: _ZN3c1010TensorImpl")
    return object()

def load_jit(name):
    scope = pathlib.Path(os.environ["SGLANG_JIT_CACHE_DIR"]) / name / "build-1"
    leaf = scope / "deps-1" / f"{name}.so"
    if leaf.exists():
        return _load(leaf)
    staging = scope / ".staging-1"
    library = ninja.build(spec=None, build_dir=staging, build_file="ldflags = -shared -lcudart\\n")
    module = _load(library)
    leaf.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(library, leaf)
    shutil.rmtree(staging)
    return module
'''

FAKE_NINJA = f'''
import os, time

def build(*, spec, build_dir, build_file):
    mode = os.environ.get("FAKE_MODE", "ok")
    if mode == "slow":
        time.sleep(120)
    if mode == "link":
        raise RuntimeError({NINJA_LINK_FAILURE!r})
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "build.ninja").write_text(build_file)
    library = build_dir / (build_dir.parent.parent.name + ".so")   # SGLang names the .so after the module
    library.write_bytes(b"\\x7fELF fake")
    return library
'''

FAKE_FILES = {
    "sglang-0.5.23.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n",
    "torch/__init__.py": ("import types\n__version__ = '2.14.1'\n_C = types.SimpleNamespace()\n"
                          "def _no_gpu(*a, **k):\n    raise RuntimeError('no CUDA GPUs are available')\n"
                          "cuda = types.SimpleNamespace(current_device=_no_gpu, get_device_capability=_no_gpu,"
                          " device_count=lambda: 0)\n"),
    "sglang/__init__.py": "", "sglang/kernels/__init__.py": "", "sglang/kernels/jit/__init__.py": "",
    "sglang/kernels/jit/utils/__init__.py": textwrap.dedent('''
        import contextlib, dataclasses
        @dataclasses.dataclass
        class ArchInfo:
            major: int
            minor: int
            suffix: str
            @property
            def target_name(self):
                return f"{self.major}.{self.minor}{self.suffix}"
        _ARCH = ArchInfo(0, 0, "")
        @contextlib.contextmanager
        def override_jit_cuda_arch(major, minor):
            global _ARCH
            old, _ARCH = _ARCH, ArchInfo(major, minor, "f" if (major, minor) == (12, 0) else "a")
            try:
                yield
            finally:
                _ARCH = old
        def get_jit_cuda_arch():
            return _ARCH
    '''),
    "sglang/kernels/jit/utils/compile/__init__.py": "",
    "sglang/kernels/jit/utils/compile/toolchain.py": (
        "import os\ndef device_compiler_path():\n    return os.path.join(os.environ['CUDA_HOME'], 'bin', 'nvcc')\n"),
    "sglang/kernels/jit/utils/compile/ninja.py": FAKE_NINJA,
    "sglang/kernels/jit/utils/compile/loader.py": FAKE_LOADER,
    "sglang/kernels/ops/__init__.py": "", "sglang/kernels/ops/kvcache/__init__.py": "",
    "sglang/kernels/ops/kvcache/kvcache.py": textwrap.dedent('''
        import logging
        from sglang.kernels.jit.utils import get_jit_cuda_arch
        from sglang.kernels.jit.utils.compile.loader import load_jit
        def can_use_store_cache(k_row_bytes, v_row_bytes=0, num_threads=0):
            try:
                load_jit(f"sgl_kernel_jit_kvcache_{k_row_bytes}_{get_jit_cuda_arch().target_name}")
                return True
            except Exception as e:
                logging.getLogger(__name__).warning(f"Failed to load JIT KV-Cache kernel: {e}")
                return False
    '''),
}


@pytest.fixture()
def fake_stack(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    for name, text in FAKE_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.1, V13.1.80'\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    return tmp_path


def run_script(fake: Path, mode: str, *args: str, nvcc: bool = True, drop_jit: bool = False) -> tuple[dict, float]:
    if not nvcc:
        (fake / "cuda" / "bin" / "nvcc").unlink()
    if drop_jit:
        import shutil
        shutil.rmtree(fake / "site" / "sglang" / "kernels")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join([str(fake / "site"), str(INIMAGE)]),
           "CUDA_HOME": str(fake / "cuda"), "FAKE_MODE": mode, "HOME": str(fake)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(SCRIPTS / "sglang_jit_gate.py"), "--arch", "12.0", *args],
                          capture_output=True, text=True, env=env, timeout=120)
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(sf.RESULT_PREFIX), done.stdout + done.stderr
    return json.loads(line[len(sf.RESULT_PREFIX):]), time.monotonic() - started


def test_the_script_builds_through_sglangs_loader_then_finds_its_cache(fake_stack):
    workspace = fake_stack / "ws"
    cold, _ = run_script(fake_stack, "ok", "--workspace", str(workspace), "--cache-label", "r1")
    assert cold["status"] == "pass", cold
    assert cold["metrics"]["evidence_level"] == "built"
    assert cold["metrics"]["jit_arch"] == "12.0f"
    kv = cold["metrics"]["modules"]["kvcache"]
    assert kv["status"] == "built" and kv["load"] == "ok"
    assert "/deps-1/" in kv["library"]   # the leaf SGLang published, not the staging folder it built in
    assert "ldflags: -shared -lcudart" in cold["evidence"]
    warm, _ = run_script(fake_stack, "ok", "--workspace", str(workspace), "--cache-label", "r2")
    assert warm["status"] == "pass" and warm["metrics"]["modules"]["kvcache"]["status"] == "cached"
    assert "(from the build cache of run r1, " in warm["reason"]


def test_the_script_quotes_the_linker(fake_stack):
    result, _ = run_script(fake_stack, "link")
    assert result["status"] == "fail"
    assert result["reason"] == f"SGLang 0.5.23's kvcache JIT module does not link for 12.0f (link): {LINKER_WORDS}"


def test_the_script_kills_a_build_past_its_limit_and_says_timeout(fake_stack):
    result, seconds = run_script(fake_stack, "slow", "--build-timeout", "8")
    assert result["status"] == "timeout", result
    assert "kvcache JIT module for 12.0f did not finish within its time limit (8 s)" in result["reason"]
    assert seconds < 60


def test_the_script_without_nvcc_fails_with_jit_possible_false(fake_stack):
    result, _ = run_script(fake_stack, "link", nvcc=False)
    assert result["status"] == "fail" and result["metrics"]["jit_possible"] is False
    assert result["reason"].startswith("no nvcc in this flavour")


def test_the_script_skips_a_release_without_jit_kernels(fake_stack):
    result, _ = run_script(fake_stack, "ok", drop_jit=True)
    assert result["status"] == "skip" and result["reason"].endswith("this release JIT-compiles none")


def test_the_script_fails_a_module_tvm_ffi_cannot_load(fake_stack):
    result, _ = run_script(fake_stack, "unloadable")
    assert result["status"] == "fail" and "undefined symbol: _ZN3c1010TensorImpl" in result["reason"]


# --------------------------------------------------------------------------------------------- the real image

def _probe_in(docker_client, image: str, before: str, workspace: Path) -> dict:
    from _probe_runs import script_result_in
    return script_result_in(docker_client, image, "sglang_jit_gate.py --arch 12.0 --gpus 8 --build-timeout 600 "
                            "--workspace /stackforge/jit-cache --cache-label test", workspace, before=before)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.pypi
def test_the_default_13_1_image_builds_sglangs_kvcache_kernel_and_fails_without_its_link_path(
        docker_client, default_13_1_image, tmp_path):
    image = default_13_1_image
    built = _probe_in(docker_client, image, "", tmp_path / "ws")
    assert built["status"] == "pass", built
    assert built["metrics"]["evidence_level"] == "built" and built["metrics"]["jit_arch"] == "12.0f"
    assert "-lcudart" in built["evidence"]
    broken = _probe_in(docker_client, image, 'mv "$CUDA_HOME/lib64" "$CUDA_HOME/lib64.off" && ', tmp_path / "ws2")
    assert broken["status"] == "fail", broken
    assert broken["reason"].endswith("(link): /usr/bin/ld: cannot find -lcudart: No such file or directory")
